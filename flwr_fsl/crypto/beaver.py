"""Beaver multiplication, seeded dealing and fixed-point truncation on additive shares.

Split out of :mod:`flwr_fsl.crypto.sharing` (which re-exports every name here): sharing holds
the sharing schemes themselves (additive, Shamir, Lagrange), this module the machinery that
multiplies and rescales additively shared values, as PrivHFL uses it. Party-local and
Flower-free; malformed material from another party is a
:class:`~flwr_fsl.crypto.sharing.ShareError`. Threat model: honest-but-curious parties.

* **Beaver triples** (any ring): shares of ``(a, b, c = a * b)`` elementwise or
  ``(A, B, C = A @ B)``. To multiply shared ``x, y`` each party publishes ``d_i = x_i - a_i``,
  ``e_i = y_i - b_i``; everyone opens ``d = x - a``, ``e = y - b`` (uniform, since ``a, b`` are
  uniform and no coalition of ``n - 1`` parties knows them), and party ``i`` sets
  ``z_i = c_i + d * b_i + e * a_i`` plus ``d * e`` for party 0. Summing:
  ``c + d b + e a + d e = ab + (x - a) b + (y - b) a + (x - a)(y - b) = x y``. For matrices
  ``X Y = (D + A)(E + B) = D E + D B + A E + A B``, so ``Z_i = C_i + D @ B_i + A_i @ E`` plus
  ``D @ E`` for party 0 (``D`` multiplies from the left, ``E`` from the right). A triple is
  used once (two openings with one ``a`` reveal ``x - x'``).
* **Seeded dealing** (:class:`Dealer`, :class:`PartyRandomness`): as in PrivHFL, a dealer (the
  querier) shares a 16-byte seed with each computing party. The dealer's own input is shared
  the same way (:meth:`Dealer.share_input`: parties ``i < n - 1`` derive ``x_i`` from their
  seeds, the last receives ``x - sum``), which hides ``x`` from any ``n - 1`` parties. For a
  triple, party ``i`` derives ``a_i, b_i`` (and ``c_i`` for ``i < n - 1``) from
  ``PRGStream.from_seed(seed_i, label, tag)``; the dealer, who knows every seed, sends only
  the last party's ``c_{n-1} = c - sum_{i < n-1} c_i``. Each party's view is its own seed and
  (for the last) a correction, which is uniform given the party's own ``a_i, b_i`` because
  ``c_0`` is uniform and unknown to it. The dealer learns nothing from the protocol provided
  it never sees the opened ``d, e`` (it does not take part in the openings) and does not
  collude with a computing party. ``(seed, label)`` must never be reused for one kind; input
  shares, triples and truncation pairs use separate PRF tags, so their labels may coincide.
* **Truncation in Z_2^k** of a fixed-point product (``x`` at ``2f`` fractional bits down to
  ``f``), for ``|x| < 2^l`` (signed):

  - :func:`truncate_local` (SecureML, Mohassel–Zhang 2017, two parties, no interaction):
    party 0 outputs ``x_0 >> f``, party 1 outputs ``-((-x_1) >> f)`` (logical shifts of
    residues in ``[0, 2^k)``). Write ``u = x_0`` and ``v = -x_1 mod 2^k``; then
    ``u - v = x (mod 2^k)`` and ``u - v`` lies in ``(-2^k, 2^k)``. If ``u - v = x`` as integers,
    ``floor(u / 2^f) - floor(v / 2^f) = floor(x / 2^f) + [u mod 2^f < x mod 2^f]``: the result is
    ``floor(x / 2^f)`` or one more, and since ``u`` is uniform the +1 happens with probability
    ``frac(x / 2^f)``, i.e. it is *unbiased stochastic rounding*. Otherwise ``u - v = x -+ 2^k``
    (a wrap) and the result is off by ``-+2^(k-f)``. The wrap happens iff ``u < x`` (``x >= 0``) or
    ``u >= 2^k + x`` (``x < 0``): probability exactly ``|x| / 2^k < 2^(l - k)``, which SecureML
    bounds by ``2^(l + 1 - k)``. For PrivHFL's ``k = 64``, ``l = 40`` that is ``< 2^-24`` per value.
  - :func:`truncate_mask` / :func:`truncate_finish` with a dealt pair ``(r, r >> f)``, for
    any number of parties: open ``c = x + 2^l + r`` (uniform: a one-time pad, so it leaks
    nothing), then ``z = (c >> f) - 2^(l-f) - (r >> f)``. With ``X = x + 2^l`` in
    ``[0, 2^(l+1))``, if ``X + r < 2^k`` the result is ``floor(x / 2^f)`` plus a carry that is 1
    with probability ``frac(x / 2^f)`` (unbiased stochastic rounding again, ``2^l`` being a
    multiple of ``2^f``); a wrap happens with probability ``X / 2^k < 2^(l + 1 - k)`` and costs
    ``-2^(k-f)``. Needs ``f <= l <= k - 2``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.prg import SEED_BYTES, PRGStream
from flwr_fsl.crypto.ring import Ring, Z2k
from flwr_fsl.crypto.sharing import ShareError, _check_int, additive_reconstruct

__all__ = [
    "TAG_INPUT",
    "TAG_TRIPLE",
    "TAG_TRUNCATION",
    "Dealer",
    "PartyRandomness",
    "TripleShape",
    "TripleShare",
    "TruncationPairShare",
    "beaver_mask",
    "beaver_matmul",
    "beaver_mul",
    "truncate_finish",
    "truncate_local",
    "truncate_mask",
]

TAG_TRIPLE = 0x742D726576616562  # b"beaver-t" little-endian
"""PRF domain tag of the streams that seeded Beaver triples are drawn from."""

TAG_TRUNCATION = 0x72702D636E757274  # b"trunc-pr" little-endian
"""PRF domain tag of the streams that seeded truncation pairs are drawn from."""

TAG_INPUT = 0x65726168732D6E69  # b"in-share" little-endian
"""PRF domain tag of the streams that seeded input shares (the dealer's own data) come from."""

_U64 = np.uint64


# ---------------------------------------------------------------------------------- Beaver


@dataclass(frozen=True)
class TripleShape:
    """Shapes of a Beaver triple: elementwise (``a``, ``b``, ``c`` alike) or matmul.

    Use :meth:`elementwise` or :meth:`for_matmul`.
    """

    kind: Literal["elementwise", "matmul"]
    a: tuple[int, ...]
    b: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            dims = getattr(self, name)
            if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
                raise ConfigurationError(
                    f"triple shape {name} must be non-negative ints, got {dims!r}"
                )
        if self.kind == "elementwise":
            if self.a != self.b:
                raise ConfigurationError(
                    f"elementwise triple needs a and b of one shape, got {self}"
                )
        elif self.kind == "matmul":
            if len(self.a) != 2 or len(self.b) != 2 or self.a[1] != self.b[0]:
                raise ConfigurationError(
                    f"matmul triple needs (m, k) and (k, n) shapes, got {self}"
                )
        else:
            raise ConfigurationError(
                f"triple kind must be 'elementwise' or 'matmul', got {self.kind!r}"
            )

    @classmethod
    def elementwise(cls, shape: int | tuple[int, ...]) -> TripleShape:
        """Triple for ``x * y`` of arrays of ``shape``."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return cls("elementwise", dims, dims)

    @classmethod
    def for_matmul(cls, m: int, k: int, n: int) -> TripleShape:
        """Triple for ``X @ Y`` with ``X`` of shape ``(m, k)`` and ``Y`` of shape ``(k, n)``."""
        return cls("matmul", (m, k), (k, n))

    @property
    def c(self) -> tuple[int, ...]:
        """Shape of ``c``: ``a``'s (elementwise) or ``(m, n)`` (matmul)."""
        return self.a if self.kind == "elementwise" else (self.a[0], self.b[1])


@dataclass(frozen=True)
class TripleShare:
    """One party's share ``(a_i, b_i, c_i)`` of a Beaver triple (``c = a * b`` or ``a @ b``)."""

    a: NDArray[np.uint64]
    b: NDArray[np.uint64]
    c: NDArray[np.uint64]


@dataclass(frozen=True)
class TruncationPairShare:
    """One party's share of a truncation pair ``(r, r >> frac_bits)``, ``r`` uniform in Z_2^k."""

    r: NDArray[np.uint64]
    r_shifted: NDArray[np.uint64]
    frac_bits: int


def _require_z2k(ring: Ring, what: str) -> Z2k:
    if not isinstance(ring, Z2k):
        raise ConfigurationError(f"{what} is defined in Z_2^k, not in {ring}")
    return ring


def _check_frac_bits(ring: Z2k, frac_bits: int) -> int:
    return _check_int(frac_bits, "frac_bits", 0, ring.bits - 1)


@dataclass(frozen=True)
class PartyRandomness:
    """A computing party's side of seeded dealing: its shares from its seed (plus a correction).

    Parameters
    ----------
    ring : Ring
        Where the triples live (Z_2^k for truncation pairs).
    seed : bytes
        The 16-byte seed this party shares with the dealer (not shown in ``repr``).
    party : int
        This party's index in ``[0, n_parties)``; the last party receives corrections.
    n_parties : int
        Number of computing parties, >= 2.

    Raises
    ------
    ConfigurationError
        If an argument is invalid.
    """

    ring: Ring
    seed: bytes = dataclasses.field(repr=False)
    party: int
    n_parties: int

    def __post_init__(self) -> None:
        if not isinstance(self.ring, Ring):
            raise ConfigurationError(f"ring must be a Ring, got {type(self.ring).__name__}")
        if not isinstance(self.seed, bytes) or len(self.seed) != SEED_BYTES:
            raise ConfigurationError(f"seed must be {SEED_BYTES} bytes")
        n = self.n_parties
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ConfigurationError(f"n_parties must be an integer >= 2, got {n!r}")
        if isinstance(self.party, bool) or not isinstance(self.party, int):
            raise ConfigurationError(f"party must be an integer, got {self.party!r}")
        if not 0 <= self.party < n:
            raise ConfigurationError(f"party must be in [0, {n}), got {self.party}")

    @property
    def receives_corrections(self) -> bool:
        """Whether this is the last party, whose ``c`` (or ``r >> f``) the dealer sends."""
        return self.party == self.n_parties - 1

    def _correction(
        self, correction: object, shape: tuple[int, ...], what: str
    ) -> NDArray[np.uint64] | None:
        """Check the dealer's correction: required for the last party, refused for others."""
        if not self.receives_corrections:
            if correction is not None:
                raise ShareError(f"party {self.party} derives its {what} share; no correction")
            return None
        if correction is None:
            raise ShareError(f"party {self.party} (the last) needs the dealer's {what} correction")
        try:
            return self.ring.validate(correction, f"{what} correction", shape)
        except ClientInputError as err:
            raise ShareError(str(err)) from err

    def _triple_parts(
        self, shape: TripleShape, label: int
    ) -> tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint64] | None]:
        stream = PRGStream.from_seed(self.seed, label, TAG_TRIPLE)
        a = self.ring.random(shape.a, stream)
        b = self.ring.random(shape.b, stream)
        c = None if self.receives_corrections else self.ring.random(shape.c, stream)
        return a, b, c

    def triple(self, shape: TripleShape, label: int, correction: object = None) -> TripleShare:
        """Return this party's share of triple ``label``.

        Parameters
        ----------
        shape : TripleShape
            Elementwise or matmul shapes.
        label : int
            The triple's number in ``[0, 2^64)``; never reuse one with the same seed.
        correction : numpy.ndarray, optional
            The dealer's ``c_{n-1}``: required for the last party, refused for the others.

        Returns
        -------
        TripleShare
            ``(a_i, b_i, c_i)``.

        Raises
        ------
        ShareError
            If the correction is malformed (a dealer's fault: drop it).
        ValueError
            If a correction is missing or unexpected, or the label is out of range.
        """
        fix = self._correction(correction, shape.c, "Beaver c")
        a, b, c = self._triple_parts(shape, label)
        if c is None:
            assert fix is not None  # the last party: checked above
            c = fix
        return TripleShare(a, b, c)

    def input_share(
        self, shape: tuple[int, ...], label: int, correction: object = None
    ) -> NDArray[np.uint64]:
        """Return this party's share of the dealer's input ``label`` (PrivHFL's query sharing).

        Parties ``i < n - 1`` derive their share from the seed; the last receives the dealer's
        ``x - sum_{i < n-1} x_i`` (:meth:`Dealer.share_input`), uniform given its own view.

        Parameters
        ----------
        shape : tuple of int
            Shape of the shared input.
        label : int
            The input's number in ``[0, 2^64)``; never reuse one with the same seed.
        correction : numpy.ndarray, optional
            The dealer's message: required for the last party, refused for the others.

        Returns
        -------
        numpy.ndarray
            This party's additive share.

        Raises
        ------
        ShareError
            If the correction is malformed.
        ValueError
            If a correction is missing or unexpected, or the label is out of range.
        """
        dims = tuple(shape)
        fix = self._correction(correction, dims, "input")
        if fix is not None:
            return fix
        return self.ring.random(dims, PRGStream.from_seed(self.seed, label, TAG_INPUT))

    def _truncation_parts(
        self, shape: tuple[int, ...], frac_bits: int, label: int
    ) -> tuple[NDArray[np.uint64], NDArray[np.uint64] | None]:
        ring = _require_z2k(self.ring, "truncation")
        _check_frac_bits(ring, frac_bits)
        stream = PRGStream.from_seed(self.seed, label, TAG_TRUNCATION)
        r = ring.random(shape, stream)
        r_shifted = None if self.receives_corrections else ring.random(shape, stream)
        return r, r_shifted

    def truncation_pair(
        self,
        shape: tuple[int, ...],
        frac_bits: int,
        label: int,
        correction: object = None,
    ) -> TruncationPairShare:
        """Return this party's share of truncation pair ``label``: ``(r_i, (r >> f)_i)``.

        Parameters
        ----------
        shape : tuple of int
            Shape of the values to truncate.
        frac_bits : int
            ``f``, the bits to drop.
        label : int
            The pair's number in ``[0, 2^64)``; never reuse one with the same seed.
        correction : numpy.ndarray, optional
            The dealer's share of ``r >> f`` for the last party; refused for the others.

        Returns
        -------
        TruncationPairShare
            ``(r_i, (r >> f)_i, f)``.

        Raises
        ------
        ShareError
            If the correction is malformed.
        ValueError
            If the ring is not Z_2^k, ``f`` is out of range, or a correction is missing or
            unexpected.
        """
        dims = tuple(shape)
        fix = self._correction(correction, dims, "truncation")
        r, r_shifted = self._truncation_parts(dims, frac_bits, label)
        if r_shifted is None:
            assert fix is not None  # the last party: checked above
            r_shifted = fix
        return TruncationPairShare(r, r_shifted, int(frac_bits))


@dataclass(frozen=True)
class Dealer:
    """The dealer of seeded correlated randomness (PrivHFL's querier): knows every seed.

    Parameters
    ----------
    ring : Ring
        Where the triples live.
    seeds : tuple of bytes
        One distinct 16-byte seed per computing party (not shown in ``repr``).

    Raises
    ------
    ConfigurationError
        If there are fewer than two seeds, a seed is not 16 bytes, or two seeds coincide.
    """

    ring: Ring
    seeds: tuple[bytes, ...] = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        seeds = tuple(self.seeds)
        object.__setattr__(self, "seeds", seeds)
        if len(seeds) < 2:
            raise ConfigurationError(f"a dealer needs >= 2 parties' seeds, got {len(seeds)}")
        if any(not isinstance(s, bytes) or len(s) != SEED_BYTES for s in seeds):
            raise ConfigurationError(f"every seed must be {SEED_BYTES} bytes")
        if len(set(seeds)) != len(seeds):
            raise ConfigurationError("the parties' seeds must be distinct")
        if not isinstance(self.ring, Ring):
            raise ConfigurationError(f"ring must be a Ring, got {type(self.ring).__name__}")

    @classmethod
    def fresh(cls, ring: Ring, n_parties: int) -> Dealer:
        """Return a dealer with fresh OS-random seeds for ``n_parties`` parties."""
        n = _check_int(n_parties, "n_parties", 2)
        return cls(ring, tuple(os.urandom(SEED_BYTES) for _ in range(n)))

    @property
    def n_parties(self) -> int:
        """Number of computing parties."""
        return len(self.seeds)

    def party(self, index: int) -> PartyRandomness:
        """Party ``index``'s side (e.g. to hand to a simulated party)."""
        return PartyRandomness(self.ring, self.seeds[index], index, self.n_parties)

    def triple(self, shape: TripleShape, label: int) -> NDArray[np.uint64]:
        """Deal triple ``label``: return the last party's correction ``c_{n-1}``.

        ``a = sum a_i``, ``b = sum b_i`` from every party's stream; ``c = a * b`` (or
        ``a @ b``); ``c_{n-1} = c - sum_{i < n-1} c_i``.

        Parameters
        ----------
        shape : TripleShape
            Elementwise or matmul shapes.
        label : int
            The triple's number; never reuse one.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``shape.c``, to send to the last party only.
        """
        ring = self.ring
        parts = [self.party(i)._triple_parts(shape, label) for i in range(self.n_parties)]
        a = additive_reconstruct(ring, [p[0] for p in parts])
        b = additive_reconstruct(ring, [p[1] for p in parts])
        c = ring.mul(a, b) if shape.kind == "elementwise" else ring.matmul(a, b)
        for p in parts[:-1]:
            assert p[2] is not None
            c = ring.sub(c, p[2])
        return c

    def triple_shares(self, shape: TripleShape, label: int) -> list[TripleShare]:
        """Every party's share of triple ``label`` (the dealer's view; for simulation)."""
        fix = self.triple(shape, label)
        return [
            self.party(i).triple(shape, label, fix if i == self.n_parties - 1 else None)
            for i in range(self.n_parties)
        ]

    def share_input(self, secret: ArrayLike, label: int) -> NDArray[np.uint64]:
        """Share the dealer's own input: return the last party's share ``x - sum_{i<n-1} x_i``.

        The other parties derive theirs with :meth:`PartyRandomness.input_share`, so sharing
        costs one message (to the last party) instead of ``n``.

        Parameters
        ----------
        secret : array_like
            Ring elements (e.g. a fixed-point encoded query batch).
        label : int
            The input's number; never reuse one.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of the secret's shape, to send to the last party only.
        """
        x = self.ring.element(secret)
        for i in range(self.n_parties - 1):
            x = self.ring.sub(x, self.party(i).input_share(x.shape, label))
        return x

    def truncation_pair(
        self, shape: tuple[int, ...], frac_bits: int, label: int
    ) -> NDArray[np.uint64]:
        """Deal truncation pair ``label``: return the last party's share of ``r >> f``.

        Parameters
        ----------
        shape : tuple of int
            Shape of the values to truncate.
        frac_bits : int
            ``f``.
        label : int
            The pair's number; never reuse one.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of ``shape``, to send to the last party only.

        Raises
        ------
        ValueError
            If the ring is not Z_2^k or ``f`` is out of range.
        """
        ring = _require_z2k(self.ring, "truncation")
        dims = tuple(shape)
        parts = [
            self.party(i)._truncation_parts(dims, frac_bits, label) for i in range(self.n_parties)
        ]
        r = additive_reconstruct(ring, [p[0] for p in parts])
        fix = np.asarray(r >> _U64(frac_bits), dtype=_U64)
        for p in parts[:-1]:
            assert p[1] is not None
            fix = ring.sub(fix, p[1])
        return fix

    def truncation_pair_shares(
        self, shape: tuple[int, ...], frac_bits: int, label: int
    ) -> list[TruncationPairShare]:
        """Every party's share of truncation pair ``label`` (for simulation)."""
        fix = self.truncation_pair(shape, frac_bits, label)
        return [
            self.party(i).truncation_pair(
                shape, frac_bits, label, fix if i == self.n_parties - 1 else None
            )
            for i in range(self.n_parties)
        ]


def _check_party(party: int) -> int:
    return _check_int(party, "party", 0)


def beaver_mask(
    ring: Ring, x: ArrayLike, y: ArrayLike, triple: TripleShare
) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """Party-local first step of a Beaver product: ``(d_i, e_i) = (x_i - a_i, y_i - b_i)``.

    Publish both; the opened ``d = sum d_i``, ``e = sum e_i`` go to :func:`beaver_mul` or
    :func:`beaver_matmul` (open them with :func:`additive_reconstruct`, which checks them).

    Parameters
    ----------
    ring : Ring
        The ring.
    x, y : array_like
        This party's shares of the operands (shapes of ``triple.a`` and ``triple.b``).
    triple : TripleShare
        This party's unused triple share.

    Returns
    -------
    tuple of numpy.ndarray
        ``(d_i, e_i)``.

    Raises
    ------
    ConfigurationError
        If a shape does not match the triple.
    """
    xs, ys = ring.element(x), ring.element(y)
    if xs.shape != triple.a.shape or ys.shape != triple.b.shape:
        raise ConfigurationError(
            f"operands {xs.shape}, {ys.shape} do not match the triple {triple.a.shape}, "
            f"{triple.b.shape}"
        )
    return ring.sub(xs, triple.a), ring.sub(ys, triple.b)


def beaver_mul(
    ring: Ring, party: int, d: ArrayLike, e: ArrayLike, triple: TripleShare
) -> NDArray[np.uint64]:
    """Party-local last step of an elementwise Beaver product: this party's share of ``x * y``.

    ``z_i = c_i + d * b_i + e * a_i``, plus ``d * e`` for party 0.

    Parameters
    ----------
    ring : Ring
        The ring.
    party : int
        This party's index (party 0 adds the public term).
    d, e : array_like
        The opened ``x - a`` and ``y - b``.
    triple : TripleShare
        The triple share used in :func:`beaver_mask`.

    Returns
    -------
    numpy.ndarray
        This party's share of ``x * y``.

    Raises
    ------
    ShareError
        If an opened value's shape does not match the triple (it came from another party).
    ConfigurationError
        If ``party`` is negative.
    """
    i = _check_party(party)
    dd, ee = ring.element(d), ring.element(e)
    if dd.shape != triple.a.shape or ee.shape != triple.b.shape:
        raise ShareError(f"opened d {dd.shape}, e {ee.shape} do not match the triple")
    z = ring.add(triple.c, ring.add(ring.mul(dd, triple.b), ring.mul(ee, triple.a)))
    return ring.add(z, ring.mul(dd, ee)) if i == 0 else z


def beaver_matmul(
    ring: Ring, party: int, d: ArrayLike, e: ArrayLike, triple: TripleShare
) -> NDArray[np.uint64]:
    """Party-local last step of a Beaver matrix product: this party's share of ``X @ Y``.

    ``Z_i = C_i + D @ B_i + A_i @ E``, plus ``D @ E`` for party 0.

    Parameters
    ----------
    ring : Ring
        The ring.
    party : int
        This party's index (party 0 adds the public term).
    d, e : array_like
        The opened ``D = X - A`` (m, k) and ``E = Y - B`` (k, n).
    triple : TripleShare
        The matmul triple share used in :func:`beaver_mask`.

    Returns
    -------
    numpy.ndarray
        This party's share of ``X @ Y``, shape ``(m, n)``.

    Raises
    ------
    ShareError
        If an opened value's shape does not match the triple (it came from another party).
    ConfigurationError
        If ``party`` is negative.
    """
    i = _check_party(party)
    dd, ee = ring.element(d), ring.element(e)
    if dd.shape != triple.a.shape or ee.shape != triple.b.shape or dd.ndim != 2:
        raise ShareError(f"opened D {dd.shape}, E {ee.shape} do not match the matmul triple")
    z = ring.add(triple.c, ring.add(ring.matmul(dd, triple.b), ring.matmul(triple.a, ee)))
    return ring.add(z, ring.matmul(dd, ee)) if i == 0 else z


# ---------------------------------------------------------------------------------- truncation


def truncate_local(ring: Ring, party: int, share: ArrayLike, frac_bits: int) -> NDArray[np.uint64]:
    """SecureML two-party local truncation by ``frac_bits`` (see the module docstring).

    Party 0 returns ``x_0 >> f``; party 1 returns ``-((-x_1) >> f)``. The opened result is
    ``floor(x / 2^f)`` or one more (unbiased), except with probability ``|x| / 2^k`` (a wrap,
    off by ``2^(k-f)``).

    Parameters
    ----------
    ring : Z2k
        The ring ``Z_2^k``.
    party : int
        0 or 1.
    share : array_like
        This party's share of ``x``.
    frac_bits : int
        ``f`` in ``[0, k)``.

    Returns
    -------
    numpy.ndarray
        This party's share of the truncated value.

    Raises
    ------
    ValueError
        If the ring is not Z_2^k, the party is not 0 or 1, or ``f`` is out of range.
    """
    z = _require_z2k(ring, "local truncation")
    f = _U64(_check_frac_bits(z, frac_bits))
    i = _check_int(party, "party (two-party truncation)", 0, 1)
    x = z.element(share)
    if i == 0:
        return np.asarray(x >> f, dtype=_U64)
    return z.neg(np.asarray(z.neg(x) >> f, dtype=_U64))


def _check_bound(ring: Z2k, bound_bits: int, frac_bits: int) -> int:
    return _check_int(bound_bits, "bound_bits", frac_bits, ring.bits - 2)


def truncate_mask(
    ring: Ring, party: int, share: ArrayLike, pair: TruncationPairShare, bound_bits: int
) -> NDArray[np.uint64]:
    """First step of dealer-assisted truncation: this party's share of ``c = x + 2^l + r``.

    Publish it; the opened ``c`` (uniform, it leaks nothing) goes to :func:`truncate_finish`.

    Parameters
    ----------
    ring : Z2k
        The ring ``Z_2^k``.
    party : int
        This party's index (party 0 adds ``2^l``).
    share : array_like
        This party's share of ``x``, ``|x| < 2^l``.
    pair : TruncationPairShare
        This party's unused truncation pair share.
    bound_bits : int
        ``l`` with ``f <= l <= k - 2``.

    Returns
    -------
    numpy.ndarray
        This party's share of ``c``.

    Raises
    ------
    ConfigurationError
        If the ring is not Z_2^k, the shapes differ, or ``l`` is out of range.
    """
    z = _require_z2k(ring, "truncation")
    i = _check_party(party)
    bound = _check_bound(z, bound_bits, pair.frac_bits)
    x = z.element(share)
    if x.shape != pair.r.shape:
        raise ConfigurationError(
            f"share {x.shape} does not match the truncation pair {pair.r.shape}"
        )
    c = z.add(x, pair.r)
    return z.add(c, _U64(1 << bound)) if i == 0 else c


def truncate_finish(
    ring: Ring, party: int, opened: ArrayLike, pair: TruncationPairShare, bound_bits: int
) -> NDArray[np.uint64]:
    """Last step of dealer-assisted truncation: this party's share of about ``x / 2^f``.

    ``z_i = -(r >> f)_i``, plus ``(c >> f) - 2^(l - f)`` for party 0. The opened result is
    ``floor(x / 2^f)`` or one more (unbiased), except with probability below ``2^(l+1-k)``.

    Parameters
    ----------
    ring : Z2k
        The ring ``Z_2^k``.
    party : int
        This party's index.
    opened : array_like
        The opened ``c``.
    pair : TruncationPairShare
        The pair share used in :func:`truncate_mask`.
    bound_bits : int
        The same ``l``.

    Returns
    -------
    numpy.ndarray
        This party's share of the truncated value.

    Raises
    ------
    ShareError
        If the opened value's shape differs from the pair's (it came from another party).
    ConfigurationError
        If the ring is not Z_2^k or ``l`` is out of range.
    """
    z = _require_z2k(ring, "truncation")
    i = _check_party(party)
    bound = _check_bound(z, bound_bits, pair.frac_bits)
    c = z.element(opened)
    if c.shape != pair.r.shape:
        raise ShareError(f"opened c {c.shape} does not match the truncation pair {pair.r.shape}")
    out = z.neg(pair.r_shifted)
    if i != 0:
        return out
    public = z.sub(
        np.asarray(c >> _U64(pair.frac_bits), dtype=_U64), _U64(1 << (bound - pair.frac_bits))
    )
    return z.add(out, public)
