"""Secret sharing over a :class:`~flwr_fsl.crypto.ring.Ring`: additive, Shamir, Lagrange.

Party-local, Flower-free building blocks for the protocols above (SSA, Bonawitz/Niu SecAgg,
SESA, PrivHFL). Every function that a party runs takes its ``party`` index; nothing here
sends a message. Material received from another party is checked with
:meth:`~flwr_fsl.crypto.ring.Ring.validate` and rejected with :class:`ShareError` (a
:class:`~flwr_fsl.core.errors.ClientInputError`: drop that sender); too few shares to reconstruct is
:class:`NotEnoughSharesError` (a :class:`~flwr_fsl.core.errors.RoundFailedError`).

Threat model: honest-but-curious parties; security statements below are per primitive.

* **Additive n-of-n** (any ring): ``x = x_0 + ... + x_{n-1}``; the first ``n - 1`` shares are
  uniform, the last is ``x - sum``. Any ``n - 1`` shares are jointly uniform and independent of
  ``x``; a coalition missing one share learns nothing.
* **Shamir t-of-n** over ``F_p`` (:class:`Shamir`): ``f(z) = x + c_1 z + ... + c_t z^t`` with
  uniform ``c_k``; party ``i`` holds ``f(z_i)`` at a distinct nonzero point ``z_i`` (default
  ``1..n``). ``threshold = t`` is the number of colluders tolerated: any ``t`` shares are
  uniform and independent of ``x`` (the values at ``t`` nonzero points and at 0 determine
  ``f`` uniquely, so for each ``x`` exactly one coefficient vector matches), and any ``t + 1``
  reconstruct ``x = f(0) = sum_j L_j(0) y_j`` (Lagrange). With more than ``t + 1`` shares the
  extra ones are checked to lie on the same degree-``t`` polynomial.
* **Lagrange evaluation** (:func:`lagrange_matrix`, :func:`interpolate`): the matrix
  ``L[i, j] = L_j(alpha_i)`` through nodes ``beta_j`` is built once (numba,
  O(K^2 + |alpha| K)), then applied to any number of value vectors with one field matmul; this
  is SESA's encoding (``u(alpha_i)`` from values at ``beta_j``) and decoding step.
Beaver triples, seeded dealing and fixed-point truncation (the multiplication side of
additive sharing) live in :mod:`flwr_fsl.crypto.beaver` and are re-exported here, so
``from flwr_fsl.crypto.sharing import Dealer`` keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.crypto.ring import PrimeField, Ring, WordSource
from flwr_fsl.kernels import field as _fk

__all__ = [
    "TAG_INPUT",
    "TAG_TRIPLE",
    "TAG_TRUNCATION",
    "Dealer",
    "NotEnoughSharesError",
    "PartyRandomness",
    "Shamir",
    "ShareError",
    "TripleShape",
    "TripleShare",
    "TruncationPairShare",
    "additive_reconstruct",
    "additive_share",
    "beaver_mask",
    "beaver_matmul",
    "beaver_mul",
    "interpolate",
    "lagrange_matrix",
    "truncate_finish",
    "truncate_local",
    "truncate_mask",
]


_U64 = np.uint64


class ShareError(ClientInputError):
    """A share (or correction) from a party is malformed, duplicated or inconsistent."""


class NotEnoughSharesError(RoundFailedError):
    """Fewer shares than the reconstruction threshold arrived: the secret is undetermined."""


def _check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigurationError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < low or (high is not None and v > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigurationError(f"{name} must be {bound}, got {v}")
    return v


def _stack_shares(
    ring: Ring, shares: NDArray[np.uint64] | Sequence[object], what: str
) -> NDArray[np.uint64]:
    """Validate untrusted shares (one per party) and stack them along a new axis 0."""
    try:
        if isinstance(shares, np.ndarray):
            if shares.ndim == 0:
                raise ShareError(f"{what}s need a leading party axis, got a 0-d array")
            stacked = ring.validate(shares, f"{what}s")
        else:
            # numpy scalars (shares of a 0-d secret) are typed: take them as 0-d arrays.
            items = [np.asarray(s) if isinstance(s, np.generic) else s for s in shares]
            first = items[0].shape if items and isinstance(items[0], np.ndarray) else None
            checked = [ring.validate(s, f"{what} {i}", first) for i, s in enumerate(items)]
            stacked = np.stack(checked) if checked else np.zeros((0,), dtype=_U64)
    except ShareError:
        raise
    except ClientInputError as err:
        raise ShareError(str(err)) from err
    if stacked.shape[0] == 0:
        raise NotEnoughSharesError(f"no {what} to reconstruct from")
    return stacked


# ---------------------------------------------------------------------------------- additive


def additive_share(
    ring: Ring, secret: ArrayLike, n_parties: int, prg: WordSource
) -> NDArray[np.uint64]:
    """Split ``secret`` into ``n_parties`` additive shares (n-of-n).

    Parameters
    ----------
    ring : Ring
        Where the secret lives.
    secret : array_like
        Ring elements (any shape).
    n_parties : int
        Number of shares, >= 2.
    prg : WordSource
        Randomness for the first ``n - 1`` shares (e.g. ``PRGStream.fresh()``).

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(n_parties, *secret.shape)``; row ``i`` is party ``i``'s.

    Raises
    ------
    ValueError
        If ``n_parties < 2`` or the secret is not made of ring elements.
    """
    n = _check_int(n_parties, "n_parties", 2)
    s = ring.element(secret)
    out = np.empty((n, *s.shape), dtype=_U64)
    out[: n - 1] = ring.random((n - 1, *s.shape), prg)
    out[n - 1] = ring.sub(s, ring.sum(out[: n - 1], axis=0))
    return out


def additive_reconstruct(
    ring: Ring, shares: NDArray[np.uint64] | Sequence[object]
) -> NDArray[np.uint64]:
    """Open an additively shared value: the sum of every party's share.

    Parameters
    ----------
    ring : Ring
        Where the shares live.
    shares : numpy.ndarray or sequence of numpy.ndarray
        One ``uint64`` share per party (along axis 0), all of one shape.

    Returns
    -------
    numpy.ndarray
        The secret.

    Raises
    ------
    ShareError
        If a share is not a uint64 array of the common shape with entries in the ring.
    NotEnoughSharesError
        If there are no shares.
    """
    return ring.sum(_stack_shares(ring, shares, "additive share"), axis=0)


# ---------------------------------------------------------------------------------- Lagrange


def _field_points(f: PrimeField, points: ArrayLike, name: str) -> NDArray[np.uint64]:
    arr = f.element(points)
    if arr.ndim != 1:
        raise ConfigurationError(
            f"{name} must be a 1-D array of field elements, got shape {arr.shape}"
        )
    return np.ascontiguousarray(arr)


def lagrange_matrix(field: PrimeField, xs: ArrayLike, at: ArrayLike) -> NDArray[np.uint64]:
    """Matrix ``L[i, j] = L_j(at[i])`` of the Lagrange basis through the distinct nodes ``xs``.

    For values ``y_j = f(xs[j])`` of any polynomial ``f`` of degree ``< len(xs)``,
    ``field.matmul(L, y) = f(at)``. Build it once and reuse it for many value vectors.

    Parameters
    ----------
    field : PrimeField
        The field.
    xs : array_like
        ``K`` distinct nodes (field elements).
    at : array_like
        Evaluation points (field elements; may include nodes).

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(len(at), K)``.

    Raises
    ------
    ConfigurationError
        If the points are not 1-D field elements or two nodes coincide.
    """
    if not isinstance(field, PrimeField):
        raise ConfigurationError(f"Lagrange interpolation needs a PrimeField, got {field}")
    nodes = _field_points(field, xs, "xs")
    targets = _field_points(field, at, "at")
    if nodes.size == 0:
        raise ConfigurationError("Lagrange interpolation needs at least one node")
    out = np.empty((targets.size, nodes.size), dtype=_U64)
    bad = _fk.lagrange_matrix(nodes, targets, _U64(field.p), out)
    if bad >= 0:
        raise ConfigurationError(
            f"Lagrange nodes must be distinct; node {int(nodes[bad])} is repeated"
        )
    return out


def interpolate(
    field: PrimeField, xs: ArrayLike, ys: ArrayLike, at: ArrayLike
) -> NDArray[np.uint64]:
    """Evaluate the polynomial through ``(xs[j], ys[j])`` at every point of ``at``.

    Parameters
    ----------
    field : PrimeField
        The field.
    xs : array_like
        ``K`` distinct nodes.
    ys : array_like
        Values at the nodes, shape ``(K, ...)`` (vector-valued: one polynomial per trailing
        coordinate).
    at : array_like
        Evaluation points.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(len(at), *ys.shape[1:])``.

    Raises
    ------
    ConfigurationError
        If the shapes disagree, the nodes repeat, or a value is not a field element.
    """
    values = field.element(ys)
    coefficients = lagrange_matrix(field, xs, at)
    if values.ndim == 0 or values.shape[0] != coefficients.shape[1]:
        raise ConfigurationError(
            f"ys needs one row per node ({coefficients.shape[1]}), got {values.shape}"
        )
    flat = values.reshape(values.shape[0], -1)
    return field.matmul(coefficients, flat).reshape((coefficients.shape[0], *values.shape[1:]))


# ---------------------------------------------------------------------------------- Shamir


@dataclass(frozen=True)
class Shamir:
    """Shamir ``t``-of-``n`` sharing over a prime field (any ``t + 1`` shares reconstruct).

    Parameters
    ----------
    field : PrimeField
        The field (SecAgg seeds and SESA use ``PrimeField()``, ``p = 2^32 - 5``).
    threshold : int
        ``t``, the number of colluding parties tolerated: the polynomial has degree ``t``;
        ``1 <= t < n``.
    points : tuple of int
        Party ``i``'s evaluation point; distinct, nonzero field elements. Use
        :meth:`for_parties` for the default points ``1..n``.

    Raises
    ------
    ConfigurationError
        If the threshold or the points are invalid.
    """

    field: PrimeField
    threshold: int
    points: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.field, PrimeField):
            raise ConfigurationError(f"Shamir needs a PrimeField, got {self.field!r}")
        pts = tuple(self.points)
        if any(isinstance(z, bool) or not isinstance(z, int | np.integer) for z in pts):
            raise ConfigurationError(f"Shamir points must be integers, got {self.points!r}")
        pts = tuple(int(z) for z in pts)
        object.__setattr__(self, "points", pts)
        if any(not 0 < z < self.field.p for z in pts):
            raise ConfigurationError(
                f"Shamir points must be nonzero elements of {self.field} (0 < z < p): the "
                f"value at 0 is the secret"
            )
        if len(set(pts)) != len(pts):
            raise ConfigurationError(f"Shamir points must be distinct, got {pts}")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t < len(pts):
            raise ConfigurationError(
                f"Shamir threshold must be an integer with 1 <= t < n = {len(pts)}, got {t!r}"
            )

    @classmethod
    def for_parties(cls, field: PrimeField, threshold: int, n_parties: int) -> Shamir:
        """Return the scheme with ``n_parties`` parties at the points ``1..n``.

        Parameters
        ----------
        field : PrimeField
            The field.
        threshold : int
            ``t`` (degree), ``1 <= t < n``.
        n_parties : int
            ``n``, below ``p``.

        Returns
        -------
        Shamir
            The scheme.

        Raises
        ------
        ConfigurationError
            If an argument is invalid.
        """
        if isinstance(n_parties, bool) or not isinstance(n_parties, int) or n_parties < 2:
            raise ConfigurationError(f"Shamir n_parties must be an integer >= 2, got {n_parties!r}")
        return cls(field, threshold, tuple(range(1, n_parties + 1)))

    @property
    def n_parties(self) -> int:
        """``n``."""
        return len(self.points)

    def share(self, secrets: ArrayLike, prg: WordSource) -> NDArray[np.uint64]:
        """Share every entry of ``secrets`` with its own random degree-``t`` polynomial.

        Parameters
        ----------
        secrets : array_like
            Field elements, any shape ``S``.
        prg : WordSource
            Randomness for the ``t`` coefficients per secret.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``(n, *S)``; row ``i`` is party ``i``'s share.

        Raises
        ------
        ValueError
            If a secret is not a field element.
        """
        f = self.field
        s = f.element(secrets)
        coefficients = np.empty((self.threshold + 1, s.size), dtype=_U64)
        coefficients[0] = s.reshape(-1)
        coefficients[1:] = f.random((self.threshold, s.size), prg)
        z = np.asarray(self.points, dtype=_U64)
        vandermonde = np.empty((self.n_parties, self.threshold + 1), dtype=_U64)
        vandermonde[:, 0] = 1
        for k in range(1, self.threshold + 1):
            vandermonde[:, k] = f.mul(vandermonde[:, k - 1], z)
        return f.matmul(vandermonde, coefficients).reshape((self.n_parties, *s.shape))

    def reconstruct(
        self,
        parties: Sequence[int],
        shares: NDArray[np.uint64] | Sequence[object],
        *,
        check: bool = True,
    ) -> NDArray[np.uint64]:
        """Recover the secrets from the shares of ``t + 1`` or more distinct parties.

        The first ``t + 1`` shares determine the value (Lagrange at 0). With ``check`` (default)
        every further share must lie on the same degree-``t`` polynomial.

        Parameters
        ----------
        parties : sequence of int
            Party indices in ``[0, n)`` of the shares, distinct.
        shares : numpy.ndarray or sequence of numpy.ndarray
            One ``uint64`` share array per listed party, all of one shape.
        check : bool, optional
            Check the extra shares for consistency.

        Returns
        -------
        numpy.ndarray
            The secrets, of the shares' shape.

        Raises
        ------
        NotEnoughSharesError
            If fewer than ``t + 1`` shares are given.
        ShareError
            If a party index is repeated or out of range, the counts differ, a share is
            malformed, or (with ``check``) the shares are inconsistent.
        """
        idx = list(parties)
        need = self.threshold + 1
        if len(idx) < need:
            raise NotEnoughSharesError(
                f"Shamir reconstruction needs t + 1 = {need} shares, got {len(idx)}"
            )
        for i in idx:
            if (
                isinstance(i, bool)
                or not isinstance(i, int | np.integer)
                or not 0 <= i < self.n_parties
            ):
                raise ShareError(f"party index must be in [0, {self.n_parties}), got {i!r}")
        if len(set(int(i) for i in idx)) != len(idx):
            raise ShareError(f"each party may contribute one share; indices repeat: {idx}")
        ys = _stack_shares(self.field, shares, "Shamir share")
        if ys.shape[0] != len(idx):
            raise ShareError(f"got {ys.shape[0]} shares for {len(idx)} party indices")
        shape = ys.shape[1:]
        flat = ys.reshape(len(idx), -1)
        xs = np.asarray([self.points[int(i)] for i in idx], dtype=_U64)
        f = self.field
        secret = f.matmul(lagrange_matrix(f, xs[:need], [0]), flat[:need])
        if check and len(idx) > need:
            predicted = f.matmul(lagrange_matrix(f, xs[:need], xs[need:]), flat[:need])
            if not np.array_equal(predicted, flat[need:]):
                raise ShareError(
                    "Shamir shares are inconsistent: they do not lie on one polynomial of "
                    f"degree {self.threshold} (parties {idx})"
                )
        return secret.reshape(shape)


# Re-exported from the module that holds them (imported last: beaver builds on the names above).
from flwr_fsl.crypto.beaver import (  # noqa: E402
    TAG_INPUT,
    TAG_TRIPLE,
    TAG_TRUNCATION,
    Dealer,
    PartyRandomness,
    TripleShape,
    TripleShare,
    TruncationPairShare,
    beaver_mask,
    beaver_matmul,
    beaver_mul,
    truncate_finish,
    truncate_local,
    truncate_mask,
)
