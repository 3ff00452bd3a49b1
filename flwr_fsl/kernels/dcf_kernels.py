"""Numba loops of the distributed comparison function (Boyle et al. EUROCRYPT'21 DCF tree).

The driver in :mod:`flwr_fsl.crypto.dcf` keeps one tree level of many keys in one buffer of
AES input blocks, encrypts the whole buffer with *one* batched AES call under the DCF's fixed
key, and hands inputs and ciphertexts to a kernel here, which finishes the Matyas–Meyer–Oseas
feed-forward (``H(y) = AES_K(y) ^ y``), applies the correction words and writes the next
level's state.

PRG of a node with seed ``s`` (a 128-bit block, bit 0 clear), all under one fixed key with a
public tweak XORed into the high word (a tweakable correlation-robust hash):

* child seed ``c`` (0 left, 1 right): ``H(s ^ (0, SEED | c))``; bit 0 of the result is the
  child's control bit, the rest (bit 0 cleared) its seed;
* child value block ``q`` of child ``c``: ``H(s ^ (0, VALUE | c * Q + q))`` for ``q < Q =
  ceil(tau / 2)``; output word ``w`` of the child is word ``w % 2`` of block ``w // 2``;
* leaf conversion block ``q``: ``H(s ^ (0, LEAF | q))``.

Correction words are level-major (``cw_seeds[level, key]``): a level's pass over many keys
reads them sequentially (key-major rows made the evaluation 3x slower: a cache miss per key).
Blocks are ``uint64`` arrays of shape ``(n, 2)`` (word 0 = bytes 0..7). Every kernel is
``cache=True``, uses ``uint64`` arithmetic with explicit casts, and writes into buffers the
caller allocated.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ZERO = np.uint64(0)
ONE = np.uint64(1)
CLEAR = ~np.uint64(1)
SEED = np.uint64(1 << 32)
VALUE = np.uint64(2 << 32)
LEAF = np.uint64(3 << 32)


@njit(cache=True, nogil=True)
def gen_blocks(seeds: np.ndarray, n_blocks: int, out: np.ndarray) -> None:  # pragma: no cover
    """Gen inputs of one level: for key ``j`` and party ``b`` the ``2 + 2Q`` tweaked blocks.

    ``seeds`` is ``(m, 2, 2)`` (key, party, word) with bit 0 clear; ``n_blocks = 2 + 2Q``.
    Layout of ``out`` rows: ``((j * 2 + b) * n_blocks + k)`` with ``k`` = 0 left seed, 1 right
    seed, ``2 + c * Q + q`` value block ``q`` of child ``c``.
    """
    m = seeds.shape[0]
    nq = (n_blocks - 2) // 2
    for j in range(m):
        for b in range(2):
            base = (j * 2 + b) * n_blocks
            lo = seeds[j, b, 0]
            hi = seeds[j, b, 1]
            for c in range(2):
                out[base + c, 0] = lo
                out[base + c, 1] = hi ^ (SEED | np.uint64(c))
            for k in range(2 * nq):
                out[base + 2 + k, 0] = lo
                out[base + 2 + k, 1] = hi ^ (VALUE | np.uint64(k))


@njit(cache=True, nogil=True)
def gen_level(  # noqa: C901, PLR0913
    inp: np.ndarray,
    enc: np.ndarray,
    n_blocks: int,
    level: int,
    domain_bits: int,
    alphas: np.ndarray,
    betas: np.ndarray,
    seeds: np.ndarray,
    t: np.ndarray,
    v_alpha: np.ndarray,
    cw_seeds: np.ndarray,
    cw_values: np.ndarray,
    cw_bits: np.ndarray,
) -> None:  # pragma: no cover - numba
    """One DCF Gen level (Boyle et al. 2021, Fig. 3) for every key; writes its correction word.

    ``inp``/``enc`` are the blocks of :func:`gen_blocks` and their AES encryptions; ``seeds``
    ``(m, 2, 2)`` and ``t`` ``(m, 2)`` are both parties' current seeds and control bits,
    ``v_alpha`` ``(m, tau)`` the running on-path sum; all three are updated in place.
    """
    m = seeds.shape[0]
    tau = betas.shape[1]
    nq = (n_blocks - 2) // 2
    shift = np.uint64(domain_bits - 1 - level)
    cs = np.empty((2, 2, 2), dtype=np.uint64)  # [party, child, word]
    ct = np.empty((2, 2), dtype=np.uint8)  # [party, child]
    cv = np.empty((2, 2, tau), dtype=np.uint64)  # [party, child, word]
    for j in range(m):
        for b in range(2):
            base = (j * 2 + b) * n_blocks
            for c in range(2):
                w0 = enc[base + c, 0] ^ inp[base + c, 0]
                ct[b, c] = np.uint8(w0 & ONE)
                cs[b, c, 0] = w0 & CLEAR
                cs[b, c, 1] = enc[base + c, 1] ^ inp[base + c, 1]
                for w in range(tau):
                    k = base + 2 + c * nq + (w >> 1)
                    cv[b, c, w] = enc[k, w & 1] ^ inp[k, w & 1]
        a = np.uint8((alphas[j] >> shift) & ONE)
        keep = np.int64(a)
        lose = 1 - keep
        t1 = t[j, 1]
        cw_seeds[level, j, 0] = cs[0, lose, 0] ^ cs[1, lose, 0]
        cw_seeds[level, j, 1] = cs[0, lose, 1] ^ cs[1, lose, 1]
        for w in range(tau):
            vcw = cv[1, lose, w] - cv[0, lose, w] - v_alpha[j, w]
            if lose == 0:
                vcw += betas[j, w]
            if t1:
                vcw = ZERO - vcw
            cw_values[level, j, w] = vcw
            acc = v_alpha[j, w] - cv[1, keep, w] + cv[0, keep, w]
            if t1:
                acc -= vcw
            else:
                acc += vcw
            v_alpha[j, w] = acc
        t_left = ct[0, 0] ^ ct[1, 0] ^ a ^ np.uint8(1)
        t_right = ct[0, 1] ^ ct[1, 1] ^ a
        cw_bits[level, j] = t_left | (t_right << np.uint8(1))
        t_keep = t_right if keep else t_left
        for b in range(2):
            s0 = cs[b, keep, 0]
            s1 = cs[b, keep, 1]
            tb = ct[b, keep]
            if t[j, b]:
                s0 ^= cw_seeds[level, j, 0]
                s1 ^= cw_seeds[level, j, 1]
                tb ^= t_keep
            seeds[j, b, 0] = s0
            seeds[j, b, 1] = s1
            t[j, b] = tb


@njit(cache=True, nogil=True)
def leaf_blocks(seeds: np.ndarray, nq: int, out: np.ndarray) -> None:  # pragma: no cover
    """Leaf conversion inputs ``s ^ (0, LEAF | q)`` of ``seeds`` (n, 2) at ``out[i * nq + q]``."""
    for i in range(seeds.shape[0]):
        for q in range(nq):
            out[i * nq + q, 0] = seeds[i, 0]
            out[i * nq + q, 1] = seeds[i, 1] ^ (LEAF | np.uint64(q))


@njit(cache=True, nogil=True)
def gen_final(
    inp: np.ndarray,
    enc: np.ndarray,
    nq: int,
    t: np.ndarray,
    v_alpha: np.ndarray,
    cw_final: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Last correction ``(-1)^t1 (Convert(s_1) - Convert(s_0) - V_alpha)`` of every key.

    ``inp``/``enc`` hold the leaf blocks of party ``b`` of key ``j`` at rows
    ``(2 * j + b) * nq + q``.
    """
    m = t.shape[0]
    tau = v_alpha.shape[1]
    for j in range(m):
        for w in range(tau):
            k0 = (2 * j) * nq + (w >> 1)
            k1 = (2 * j + 1) * nq + (w >> 1)
            c0 = enc[k0, w & 1] ^ inp[k0, w & 1]
            c1 = enc[k1, w & 1] ^ inp[k1, w & 1]
            y = c1 - c0 - v_alpha[j, w]
            if t[j, 1]:
                y = ZERO - y
            cw_final[j, w] = y


@njit(cache=True, nogil=True)
def eval_blocks(
    seeds: np.ndarray,
    points: np.ndarray,
    level: int,
    domain_bits: int,
    n_blocks: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Eval inputs of one level: per point its chosen child's seed block and ``Q`` value blocks.

    ``n_blocks = 1 + Q``; row ``i * n_blocks`` is the seed block, then the value blocks.
    """
    nq = n_blocks - 1
    shift = np.uint64(domain_bits - 1 - level)
    for i in range(seeds.shape[0]):
        c = (points[i] >> shift) & ONE
        base = i * n_blocks
        lo = seeds[i, 0]
        hi = seeds[i, 1]
        out[base, 0] = lo
        out[base, 1] = hi ^ (SEED | c)
        for q in range(nq):
            out[base + 1 + q, 0] = lo
            out[base + 1 + q, 1] = hi ^ (VALUE | (c * np.uint64(nq) + np.uint64(q)))


@njit(cache=True, nogil=True)
def eval_level(  # noqa: PLR0913
    inp: np.ndarray,
    enc: np.ndarray,
    n_blocks: int,
    level: int,
    domain_bits: int,
    points: np.ndarray,
    key_idx: np.ndarray,
    cw_seeds: np.ndarray,
    cw_values: np.ndarray,
    cw_bits: np.ndarray,
    party: int,
    seeds: np.ndarray,
    t: np.ndarray,
    acc: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Follow one level for every point: ``V += (-1)^b (v_c + t * V_CW)``, then correct the seed.

    ``seeds`` ``(n, 2)``, ``t`` ``(n,)`` and ``acc`` ``(n, tau)`` are updated in place.
    """
    tau = acc.shape[1]
    shift = np.uint64(domain_bits - 1 - level)
    for i in range(seeds.shape[0]):
        j = key_idx[i]
        c = np.uint8((points[i] >> shift) & ONE)
        base = i * n_blocks
        w0 = enc[base, 0] ^ inp[base, 0]
        tc = np.uint8(w0 & ONE)
        s0 = w0 & CLEAR
        s1 = enc[base, 1] ^ inp[base, 1]
        tt = t[i]
        for w in range(tau):
            k = base + 1 + (w >> 1)
            v = enc[k, w & 1] ^ inp[k, w & 1]
            if tt:
                v += cw_values[level, j, w]
            if party:
                acc[i, w] -= v
            else:
                acc[i, w] += v
        if tt:
            s0 ^= cw_seeds[level, j, 0]
            s1 ^= cw_seeds[level, j, 1]
            tc ^= (cw_bits[level, j] >> c) & np.uint8(1)
        seeds[i, 0] = s0
        seeds[i, 1] = s1
        t[i] = tc


@njit(cache=True, nogil=True)
def eval_final(
    inp: np.ndarray,
    enc: np.ndarray,
    nq: int,
    key_idx: np.ndarray,
    cw_final: np.ndarray,
    party: int,
    t: np.ndarray,
    acc: np.ndarray,
) -> None:  # pragma: no cover - numba
    """``V += (-1)^b (Convert(s) + t * CW_final)`` for every point (leaf blocks at ``i * nq``)."""
    tau = acc.shape[1]
    for i in range(t.shape[0]):
        j = key_idx[i]
        for w in range(tau):
            k = i * nq + (w >> 1)
            v = enc[k, w & 1] ^ inp[k, w & 1]
            if t[i]:
                v += cw_final[j, w]
            if party:
                acc[i, w] -= v
            else:
                acc[i, w] += v
