"""Cui's updatable DPF (U-DPF, §5) over the keys of :mod:`flwr_fsl.crypto.dpf`.

A U-DPF hint is a fresh leaf correction word masked by ``H(s_0, e) - H(s_1, e)`` at a new epoch
``e``: the client, who kept both shares, computes it (:func:`next_hint_batch`), and each server
applies the same public hint to its share (:func:`update_batch`), moving the key pair from
``f_{alpha, beta}`` to ``f_{alpha, beta'}`` without a new Gen. Its security needs every epoch to
be used once per key pair, which :func:`update` and :func:`next_hint` enforce (epochs strictly
increase). The hint and its wire format are :class:`UpdateHint` (kind 3 of the ``FDPF`` blobs of
:mod:`flwr_fsl.crypto.dpf_keys`); :mod:`flwr_fsl.crypto.dpf` re-exports all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf_keys import (
    _GEN_CHUNK,
    _HEADER_BYTES,
    _KIND_HINT,
    _NO_PARTY,
    _U64,
    _VERSION,
    MAX_TAU,
    DPFKey,
    DPFKeyBatch,
    DPFKeyError,
    DPFPublicBatch,
    _as_index,
    _as_u64,
    _betas_matrix,
    _check_epoch,
    _group,
    _header,
    _parse_header,
    _tree_levels,
)
from flwr_fsl.crypto.prg import _mmo_ciphers
from flwr_fsl.kernels import dpf_kernels as _k

__all__ = ["UpdateHint", "next_hint", "next_hint_batch", "update", "update_batch"]


@dataclass(frozen=True, eq=False)
class UpdateHint:
    """U-DPF hint (Cui §5): new leaf correction words of ``m`` keys for one epoch.

    The same hint goes to both servers (it is public); applying it with :func:`update` moves a
    key pair from ``f_{alpha, beta}`` to ``f_{alpha, beta'}``.

    Parameters
    ----------
    epoch : int
        The new epoch (strictly larger than the keys' epochs).
    tau : int
        Output words per point.
    cw_leaf : numpy.ndarray
        ``(m, W)`` uint64 new leaf correction words.

    Raises
    ------
    DPFKeyError
        If a field is malformed.
    """

    epoch: int
    tau: int
    cw_leaf: NDArray[np.uint64]

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, int | np.integer) or not 0 <= int(self.epoch) < 1 << 64:
            raise DPFKeyError(f"hint epoch must be an integer in [0, 2**64), got {self.epoch!r}")
        if not isinstance(self.tau, int | np.integer) or not 1 <= int(self.tau) <= MAX_TAU:
            raise DPFKeyError(f"hint tau must be in [1, {MAX_TAU}], got {self.tau!r}")
        w = _group(int(self.tau)) * int(self.tau)
        leaf = self.cw_leaf
        if not isinstance(leaf, np.ndarray) or leaf.dtype != _U64 or leaf.ndim != 2:
            raise DPFKeyError("hint cw_leaf must be a 2-D uint64 array")
        if leaf.shape[1] != w:
            raise DPFKeyError(f"hint cw_leaf has {leaf.shape[1]} words per key, tau needs {w}")
        object.__setattr__(self, "epoch", int(self.epoch))
        object.__setattr__(self, "tau", int(self.tau))
        object.__setattr__(self, "cw_leaf", np.ascontiguousarray(leaf))

    def to_bytes(self) -> bytes:
        """Serialize (kind 3)."""
        w = _header(_KIND_HINT, _NO_PARTY, self.tau, self.cw_leaf.shape[0])
        w.u64(self.epoch)
        w.words(self.cw_leaf, "<u8")
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> UpdateHint:
        """Parse and validate a serialized hint.

        Raises
        ------
        DPFKeyError
            If the blob is truncated, too long or malformed.
        """
        r, tau, m, _, version = _parse_header(data, _KIND_HINT)
        if version != _VERSION:
            raise DPFKeyError(f"unsupported hint format version {version}")
        w = _group(tau) * tau
        need = _HEADER_BYTES + 8 + 8 * m * w
        if len(r.data) != need:
            raise DPFKeyError(f"hint has {len(r.data)} bytes, expected {need}")
        epoch = r.u64("epoch")
        leaf = r.words(m * w, "<u8", "cw_leaf").astype(_U64)
        r.done()
        return cls(epoch=epoch, tau=tau, cw_leaf=leaf.reshape(m, w))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UpdateHint) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


# ------------------------------------------------------------------------------------------------


def _check_pair(k0: DPFKeyBatch, k1: DPFKeyBatch) -> None:
    if k0.party != 0 or k1.party != 1:
        raise DPFKeyError("need party 0's and party 1's shares, in that order")
    if k0.public is not k1.public and k0.public.to_bytes() != k1.public.to_bytes():
        raise DPFKeyError("the two shares have different public parts")


def next_hint_batch(  # noqa: C901, PLR0915
    k0: DPFKeyBatch,
    k1: DPFKeyBatch,
    new_betas: ArrayLike,
    epoch: int,
    *,
    alphas: ArrayLike | None = None,
) -> UpdateHint:
    """Client side of U-DPF: the hint moving ``m`` key pairs to new values at a new epoch.

    The new leaf correction word is ``CW = (-1)^t1 * (beta' - H(s0, e) + H(s1, e))`` with the
    two leaf seeds on the ``alpha`` path and ``H`` the epoch-keyed conversion. The path is found
    from the two shares (control bits differ exactly on it); with odd ``tau`` the point's last
    bit sits in the leaf group and is read from the current ``beta`` unless ``alphas`` is given.

    Parameters
    ----------
    k0, k1 : DPFKeyBatch
        Both parties' current shares (the client keeps them).
    new_betas : array_like
        ``(m,)`` or ``(m, tau)`` new values.
    epoch : int
        The new epoch, larger than every key's current epoch.
    alphas : array_like, optional
        ``(m,)`` points; needed only when ``tau`` is odd, a current ``beta`` is 0 and the new
        one is not (then the point's last bit is not recoverable from the keys).

    Returns
    -------
    UpdateHint
        The public hint for both servers.

    Raises
    ------
    DPFKeyError
        If the shares are not the two halves of the same point functions.
    ValueError
        If the epoch is not fresh, shapes disagree, or ``alphas`` is needed / inconsistent.
    """
    _check_pair(k0, k1)
    pub = k0.public
    m, tau = pub.num_keys, pub.tau
    betas = _betas_matrix(new_betas, m)
    if betas.shape[1] != tau:
        raise ConfigurationError(f"new betas have tau={betas.shape[1]}, keys have tau={tau}")
    e = _check_epoch(epoch)
    if m and e <= int(pub.epochs.max()):
        raise ConfigurationError(f"epoch {e} is not newer than the keys' epochs")
    group = _group(tau)
    half_w = pub.leaf_words // 2
    w = 2 * half_w
    tl = _tree_levels(pub.domain_bits, tau)
    order = np.argsort(-tl, kind="stable").astype(np.int64)
    neg_sorted = -tl[order]
    aes = _mmo_ciphers()
    path_bits = np.zeros(m, dtype=_U64)
    bad = np.zeros(m, dtype=np.uint8)
    h_old = np.empty((m, 2, w), dtype=_U64)
    h_new = np.empty((m, 2, w), dtype=_U64)
    t1 = np.empty(m, dtype=np.uint8)
    new_epochs = np.full(m, e, dtype=_U64)
    chunk = min(_GEN_CHUNK, max(m, 1))
    seeds = np.empty((2 * chunk, 2), dtype=_U64)  # party b's seed of key i at row 2 * i + b
    enc_l = np.empty((2 * chunk + 1, 2), dtype=_U64)
    enc_r = np.empty((2 * chunk + 1, 2), dtype=_U64)
    conv = np.empty((2 * chunk * half_w, 2), dtype=_U64)
    conv_enc = np.empty((2 * chunk * half_w + 1, 2), dtype=_U64)
    words = np.empty((chunk, 2, w), dtype=_U64)
    state_t = np.empty((chunk, 2), dtype=np.uint8)
    for lo in range(0, m, chunk):
        n = min(chunk, m - lo)
        rows = order[lo : lo + n]
        _k.gen_init(order, lo, n, k0.root_seeds, k1.root_seeds, state_t, seeds)
        neg = neg_sorted[lo : lo + n]
        for level in range(int(-neg[0])):
            active = int(np.searchsorted(neg, -level, side="left"))
            aes.left.encrypt_prefix_into(seeds[: 2 * active], enc_l)
            aes.right.encrypt_prefix_into(seeds[: 2 * active], enc_r)
            _k.pair_path_level(
                enc_l,
                enc_r,
                seeds,
                active,
                level,
                order,
                lo,
                pub.level_offsets,
                pub.cw_seeds,
                pub.cw_bits,
                state_t,
                path_bits,
                bad,
            )
        t1[rows] = state_t[:n, 1]
        if np.any(state_t[:n, 0] == state_t[:n, 1]):
            bad[rows[state_t[:n, 0] == state_t[:n, 1]]] = 1
        for ep, dest in ((pub.epochs, h_old), (new_epochs, h_new)):
            _k.leaf_blocks_pair(n, seeds, ep, order, lo, half_w, conv)
            aes.value.encrypt_prefix_into(conv[: 2 * n * half_w], conv_enc)
            _k.leaf_words_pair(conv_enc, conv, n, half_w, words)
            dest[rows] = words[:n]
    if bad.any():
        raise DPFKeyError(f"{int(bad.sum())} key pair(s) do not share one point function")
    sign = np.where(t1 == 1, _U64(0xFFFFFFFFFFFFFFFF), _U64(1)).astype(_U64)[:, None]
    dbits = pub.domain_bits.astype(np.int64)
    gpos = np.zeros(m, dtype=np.int64)
    if group == 2:
        has = dbits >= 1
        if alphas is not None:
            a = _as_index(alphas, "alphas")
            if a.shape != (m,):
                raise ConfigurationError(f"alphas must have shape ({m},), got {a.shape}")
            if np.any(np.where(has, a >> _U64(1), _U64(0)) != path_bits) or np.any(
                (~has) & (a != 0)
            ):
                raise ConfigurationError("alphas do not match the keys' points")
            gpos = np.where(has, a & _U64(1), _U64(0)).astype(np.int64)
        else:
            u_old = sign * pub.cw_leaf + h_old[:, 0] - h_old[:, 1]
            nz = np.stack([u_old[:, :tau].any(axis=1), u_old[:, tau:].any(axis=1)], axis=1)
            if np.any(nz.all(axis=1)):
                raise DPFKeyError("a key pair encodes a non-zero value at two points")
            unknown = has & ~nz.any(axis=1) & betas.any(axis=1)
            if unknown.any():
                raise ConfigurationError(
                    f"{int(unknown.sum())} key(s) hold beta = 0, so the point's last bit is not "
                    "in the keys: pass alphas"
                )
            gpos = np.where(nz[:, 1], 1, 0).astype(np.int64)
    u = np.zeros((m, w), dtype=_U64)
    cols = gpos[:, None] * tau + np.arange(tau)[None, :]
    np.put_along_axis(u, cols, betas, axis=1)
    cw = sign * (u - h_new[:, 0] + h_new[:, 1])
    return UpdateHint(epoch=e, tau=tau, cw_leaf=np.ascontiguousarray(cw, dtype=_U64))


def next_hint(
    k0: DPFKey,
    k1: DPFKey,
    new_beta: int | ArrayLike,
    epoch: int,
    *,
    alpha: int | None = None,
) -> UpdateHint:
    """Client side of U-DPF for one key pair (see :func:`next_hint_batch`).

    Parameters
    ----------
    k0, k1 : DPFKey
        Both parties' current shares.
    new_beta : int or array_like
        New value (``tau`` words).
    epoch : int
        The new epoch, larger than the keys' epoch.
    alpha : int, optional
        The point; needed only in the case described in :func:`next_hint_batch`.

    Returns
    -------
    UpdateHint
        The public hint for both servers.

    Raises
    ------
    DPFKeyError
        If the shares are not the two halves of one point function.
    ValueError
        If the epoch is not fresh or ``new_beta`` has the wrong size.
    """
    b = _as_u64(new_beta, "new_beta").reshape(1, -1)
    alphas = None if alpha is None else [alpha]
    return next_hint_batch(k0.as_batch(), k1.as_batch(), b, epoch, alphas=alphas)


def update_batch(keys: DPFKeyBatch, hint: UpdateHint, epoch: int) -> DPFKeyBatch:
    """Server side of U-DPF: replace the leaf correction words of a batch with a hint's.

    Parameters
    ----------
    keys : DPFKeyBatch
        One server's shares (any party).
    hint : UpdateHint
        The hint for ``epoch``.
    epoch : int
        The epoch the server expects (binds the hint to the round).

    Returns
    -------
    DPFKeyBatch
        New shares for ``epoch``; the old ones stay valid for their own epoch.

    Raises
    ------
    DPFKeyError
        If the hint is for another epoch, another ``tau`` or number of keys, or not newer than
        the keys.
    """
    if not isinstance(hint, UpdateHint):
        raise DPFKeyError("hint must be an UpdateHint")
    pub = keys.public
    if hint.epoch != epoch:
        raise DPFKeyError(f"hint is for epoch {hint.epoch}, expected {epoch}")
    if hint.tau != pub.tau or hint.cw_leaf.shape[0] != pub.num_keys:
        raise DPFKeyError(
            f"hint is for {hint.cw_leaf.shape[0]} keys with tau={hint.tau}, "
            f"keys are {pub.num_keys} with tau={pub.tau}"
        )
    if pub.num_keys and hint.epoch <= int(pub.epochs.max()):
        raise DPFKeyError(f"stale hint: epoch {hint.epoch} is not newer than the keys' epochs")
    new_pub = DPFPublicBatch(
        tau=pub.tau,
        domain_bits=pub.domain_bits,
        epochs=np.full(pub.num_keys, hint.epoch, dtype=_U64),
        cw_seeds=pub.cw_seeds,
        cw_bits=pub.cw_bits,
        cw_leaf=hint.cw_leaf.copy(),
        cw_proof=pub.cw_proof,  # leaf seeds do not change: a verifiable key stays verifiable
    )
    return DPFKeyBatch(party=keys.party, root_seeds=keys.root_seeds, public=new_pub)


def update(key: DPFKey, hint: UpdateHint, epoch: int) -> DPFKey:
    """Server side of U-DPF for one key (see :func:`update_batch`).

    Parameters
    ----------
    key : DPFKey
        One server's share.
    hint : UpdateHint
        The hint for ``epoch`` (one key).
    epoch : int
        The epoch the server expects.

    Returns
    -------
    DPFKey
        The updated share.

    Raises
    ------
    DPFKeyError
        As :func:`update_batch`.
    """
    return update_batch(key.as_batch(), hint, epoch).key(0)
