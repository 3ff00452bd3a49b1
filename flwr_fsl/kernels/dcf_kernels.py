"""Numba loops of the distributed comparison function (Boyle et al. EUROCRYPT'21 DCF tree).

The driver in :mod:`flwr_fsl.crypto.dcf` keeps one tree level of many keys in one buffer of
AES input blocks, encrypts the whole buffer with *one* batched AES call under the DCF's fixed
key (``update_into`` into a reused buffer), and hands the ciphertexts to one kernel per level
(:func:`gen_step`, :func:`eval_step`, and their unrolled ``tau = 2`` twins), which finishes the
Matyas–Meyer–Oseas feed-forward (``H(y) = AES_K(y) ^ y``, the input ``y`` recomputed from the
seeds rather than read back), applies the correction words without branching on a secret
bit, and writes the next level's seeds and AES inputs.

PRG of a node with seed ``s`` (a 128-bit block, bit 0 clear), all under one fixed key with a
public tweak XORed into the high word (a tweakable correlation-robust hash):

* child seed ``c`` (0 left, 1 right): ``H(s ^ (0, SEED | c))``; bit 0 of the result is the
  child's control bit, the rest (bit 0 cleared) its seed;
* the node's value block ``q``: ``H(s ^ (0, VALUE | q))`` for ``q < Q = ceil(tau / 2)``; value
  word ``w`` is word ``w % 2`` of block ``w // 2`` (key format version 2: one value per node,
  not one per child as in version 1);
* a leaf's value block ``q``: ``H(s ^ (0, LEAF | q))``.

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
TWO, THREE, FOUR, FIVE, SIX, TWELVE = (np.uint64(k) for k in (2, 3, 4, 5, 6, 12))


@njit(cache=True, nogil=True)
def gen_blocks(seeds: np.ndarray, n_blocks: int, out: np.ndarray) -> None:  # pragma: no cover
    """Gen inputs of one level: for key ``j`` and party ``b`` the ``2 + Q`` tweaked blocks.

    ``seeds`` is ``(m, 2, 2)`` (key, party, word) with bit 0 clear; ``n_blocks = 2 + Q``.
    Layout of ``out`` rows: ``((j * 2 + b) * n_blocks + k)`` with ``k`` = 0 left seed, 1 right
    seed, ``2 + q`` the node's value block ``q``.
    """
    m = seeds.shape[0]
    nq = n_blocks - 2
    for j in range(m):
        for b in range(2):
            base = (j * 2 + b) * n_blocks
            lo = seeds[j, b, 0]
            hi = seeds[j, b, 1]
            for c in range(2):
                out[base + c, 0] = lo
                out[base + c, 1] = hi ^ (SEED | np.uint64(c))
            for k in range(nq):
                out[base + 2 + k, 0] = lo
                out[base + 2 + k, 1] = hi ^ (VALUE | np.uint64(k))


@njit(cache=True, nogil=True, inline="always")
def _ff(enc: np.ndarray, row: int, word: int, lo: np.uint64, hi: np.uint64, tweak: np.uint64):  # type: ignore[no-untyped-def]  # pragma: no cover
    """MMO feed-forward of one word: ``enc ^ (lo, hi ^ tweak)`` (the input is recomputed)."""
    if word:
        return enc[row, 1] ^ hi ^ tweak
    return enc[row, 0] ^ lo


@njit(cache=True, nogil=True, inline="always")
def _gen_inputs(
    inp: np.ndarray, base: int, nq: int, lo: np.uint64, hi: np.uint64
) -> None:  # pragma: no cover - numba
    """One party's ``2 + Q`` Gen input blocks of a node from row ``base`` (gen_blocks')."""
    for c in range(2):
        inp[base + c, 0] = lo
        inp[base + c, 1] = hi ^ (SEED | np.uint64(c))
    for k in range(nq):
        inp[base + 2 + k, 0] = lo
        inp[base + 2 + k, 1] = hi ^ (VALUE | np.uint64(k))


@njit(cache=True, nogil=True)
def gen_step(  # noqa: PLR0913, PLR0915
    enc: np.ndarray,
    n_blocks: int,
    level: int,
    domain_bits: int,
    lo: int,
    alphas: np.ndarray,
    betas: np.ndarray,
    seeds: np.ndarray,
    t: np.ndarray,
    v_alpha: np.ndarray,
    cw_seeds: np.ndarray,
    cw_values: np.ndarray,
    cw_bits: np.ndarray,
    inp: np.ndarray,
) -> None:  # pragma: no cover - numba
    """:func:`gen_level` fused with the next level's :func:`gen_blocks` (the same keys).

    Reads only the ciphertexts ``enc`` (the AES inputs are recomputed from ``seeds``, which
    still hold this level's seeds), writes key ``lo + j``'s correction word straight into the
    whole-batch arrays ``cw_seeds``, ``cw_values``, ``cw_bits`` (C-contiguous, no strided
    views), updates ``seeds``, ``t``, ``v_alpha`` and, below the last level, writes the next
    level's AES inputs into ``inp`` (layout of :func:`gen_blocks`). ``alphas`` and ``betas``
    are the whole batch's.
    """
    m = seeds.shape[0]
    tau = betas.shape[1]
    nq = n_blocks - 2
    shift = np.uint64(domain_bits - 1 - level)
    more = level + 1 < domain_bits
    for j in range(m):
        g = lo + j
        a = (alphas[g] >> shift) & ONE
        keep = int(a)
        lose = 1 - keep
        b0 = (2 * j) * n_blocks
        b1 = b0 + n_blocks
        l0 = seeds[j, 0, 0]
        h0 = seeds[j, 0, 1]
        l1 = seeds[j, 1, 0]
        h1 = seeds[j, 1, 1]
        # child seed blocks after the feed-forward: party p, child c -> (w0, w1)
        p0l0 = enc[b0, 0] ^ l0
        p0r0 = enc[b0 + 1, 0] ^ l0
        p1l0 = enc[b1, 0] ^ l1
        p1r0 = enc[b1 + 1, 0] ^ l1
        t_left = np.uint8((p0l0 ^ p1l0 ^ a ^ ONE) & ONE)
        t_right = np.uint8((p0r0 ^ p1r0 ^ a) & ONE)
        tw_keep = SEED | np.uint64(keep)
        cw0 = (enc[b0 + lose, 0] ^ l0 ^ enc[b1 + lose, 0] ^ l1) & CLEAR
        cw1 = enc[b0 + lose, 1] ^ h0 ^ enc[b1 + lose, 1] ^ h1
        cw_seeds[level, g, 0] = cw0
        cw_seeds[level, g, 1] = cw1
        cw_bits[level, g] = t_left | (t_right << np.uint8(1))
        m0 = ZERO - np.uint64(t[j, 0])  # all ones where party 0's control bit is set
        m1 = ZERO - np.uint64(t[j, 1])
        ma = ZERO - a  # all ones where alpha's bit is 1 (the lost child is the left one)
        for w in range(tau):
            q = w >> 1
            tw = VALUE | np.uint64(q)
            v0 = _ff(enc, b0 + 2 + q, w & 1, l0, h0, tw)  # the node's own value, each party
            v1 = _ff(enc, b1 + 2 + q, w & 1, l1, h1, tw)
            # raw = v1 - v0 - V_alpha + beta a_i; V_CW = (-1)^t1 raw (branch-free), and the
            # path's sum after this level is V_alpha + v0 - v1 + (-1)^t1 V_CW = beta a_i.
            ba = betas[g, w] & ma
            raw = v1 - v0 - v_alpha[j, w] + ba
            cw_values[level, g, w] = (raw ^ m1) - m1
            v_alpha[j, w] = ba
        t_keep = t_left ^ ((t_left ^ t_right) & np.uint8(a))
        # party 0's and party 1's kept child, corrected where their control bit is set
        k0 = enc[b0 + keep, 0] ^ l0
        k1 = enc[b1 + keep, 0] ^ l1
        s00 = (k0 & CLEAR) ^ (cw0 & m0)
        s01 = enc[b0 + keep, 1] ^ h0 ^ tw_keep ^ (cw1 & m0)
        tb0 = np.uint8(k0 & ONE) ^ (t_keep & t[j, 0])
        s10 = (k1 & CLEAR) ^ (cw0 & m1)
        s11 = enc[b1 + keep, 1] ^ h1 ^ tw_keep ^ (cw1 & m1)
        tb1 = np.uint8(k1 & ONE) ^ (t_keep & t[j, 1])
        seeds[j, 0, 0] = s00
        seeds[j, 0, 1] = s01
        seeds[j, 1, 0] = s10
        seeds[j, 1, 1] = s11
        t[j, 0] = tb0
        t[j, 1] = tb1
        if more:
            _gen_inputs(inp, b0, nq, s00, s01)
            _gen_inputs(inp, b1, nq, s10, s11)


@njit(cache=True, nogil=True, inline="always")
def _put_inputs(
    ip: np.ndarray, base: np.uint64, lo: np.uint64, hi: np.uint64
) -> None:  # pragma: no cover
    """One party's three ``tau = 2`` Gen input blocks at flat word ``base`` (:func:`gen_blocks`)."""
    ip[base] = lo
    ip[base + ONE] = hi ^ SEED
    ip[base + TWO] = lo
    ip[base + THREE] = hi ^ (SEED | ONE)
    ip[base + FOUR] = lo
    ip[base + FIVE] = hi ^ VALUE


@njit(cache=True, nogil=True)
def gen_step_tau2(  # noqa: PLR0913, PLR0915
    enc: np.ndarray,
    level: int,
    domain_bits: int,
    lo: int,
    alphas: np.ndarray,
    betas: np.ndarray,
    seeds: np.ndarray,
    t: np.ndarray,
    v_alpha: np.ndarray,
    cw_seeds: np.ndarray,
    cw_values: np.ndarray,
    cw_bits: np.ndarray,
    inp: np.ndarray,
) -> None:  # pragma: no cover - numba
    """:func:`gen_step` for ``tau = 2`` (one value block per node), unrolled: the same words.

    The ReLU of :mod:`flwr_fsl.families.privhfl` uses ``tau = 2``; with the loops over words
    and blocks unrolled and no branch on a secret bit this kernel takes ~2/3 of the time of
    the general one. ``enc`` and ``inp`` are read and written as flat words at unsigned
    offsets (numba then emits no negative-index checks: ~20% less time, the same words).
    """
    e = enc.reshape(-1)
    ip = inp.reshape(-1)
    sd = seeds.reshape(-1)
    tf = t.reshape(-1)
    va = v_alpha.reshape(-1)
    bf = betas.reshape(-1)
    fs = cw_seeds.reshape(-1)
    fv = cw_values.reshape(-1)
    fb = cw_bits.reshape(-1)
    row = np.uint64(level) * np.uint64(cw_bits.shape[1])
    shift = np.uint64(domain_bits - 1 - level)
    more = level + 1 < domain_bits
    for jj in range(seeds.shape[0]):
        j = np.uint64(jj)
        g = np.uint64(lo) + j
        a = (alphas[g] >> shift) & ONE  # keep = a, lose = 1 - a
        lose2 = TWO - TWO * a  # word offset of the lost child's seed block within a party's
        keep2 = TWO * a
        b0 = TWELVE * j  # party 0's three blocks (6 words), then party 1's
        b1 = b0 + SIX
        k4 = FOUR * j  # key j's seeds (party 0, then 1) in ``sd``, its bits at ``2 j`` in ``tf``
        l0 = sd[k4]
        h0 = sd[k4 + ONE]
        l1 = sd[k4 + TWO]
        h1 = sd[k4 + THREE]
        t0 = np.uint64(tf[TWO * j])
        t1 = np.uint64(tf[TWO * j + ONE])
        m0 = ZERO - t0
        m1 = ZERO - t1
        ma = ZERO - a
        x0l = e[b0 + lose2] ^ l0
        x1l = e[b1 + lose2] ^ l1
        x0k = e[b0 + keep2] ^ l0
        x1k = e[b1 + keep2] ^ l1
        t_left = (e[b0] ^ l0 ^ e[b1] ^ l1 ^ a ^ ONE) & ONE
        t_right = (e[b0 + TWO] ^ l0 ^ e[b1 + TWO] ^ l1 ^ a) & ONE
        cw0 = (x0l ^ x1l) & CLEAR
        cw1 = e[b0 + lose2 + ONE] ^ h0 ^ e[b1 + lose2 + ONE] ^ h1  # the tweaks cancel
        at = row + g  # key g's correction of this level
        fs[TWO * at] = cw0
        fs[TWO * at + ONE] = cw1
        fb[at] = np.uint8(t_left | (t_right << ONE))
        # words 0 and 1 of the node's value block (gen_step), each party's
        ba = bf[TWO * g] & ma
        raw = (e[b1 + FOUR] ^ l1) - (e[b0 + FOUR] ^ l0) - va[TWO * j] + ba
        fv[TWO * at] = (raw ^ m1) - m1
        va[TWO * j] = ba
        ba = bf[TWO * g + ONE] & ma
        raw = (e[b1 + FIVE] ^ h1 ^ VALUE) - (e[b0 + FIVE] ^ h0 ^ VALUE) - va[TWO * j + ONE] + ba
        fv[TWO * at + ONE] = (raw ^ m1) - m1
        va[TWO * j + ONE] = ba
        t_keep = t_left ^ ((t_left ^ t_right) & a)
        tws = SEED | a
        s00 = (x0k & CLEAR) ^ (cw0 & m0)
        s01 = e[b0 + keep2 + ONE] ^ h0 ^ tws ^ (cw1 & m0)
        s10 = (x1k & CLEAR) ^ (cw0 & m1)
        s11 = e[b1 + keep2 + ONE] ^ h1 ^ tws ^ (cw1 & m1)
        sd[k4] = s00
        sd[k4 + ONE] = s01
        sd[k4 + TWO] = s10
        sd[k4 + THREE] = s11
        tf[TWO * j] = np.uint8((x0k & ONE) ^ (t_keep & t0))
        tf[TWO * j + ONE] = np.uint8((x1k & ONE) ^ (t_keep & t1))
        if more:
            _put_inputs(ip, b0, s00, s01)
            _put_inputs(ip, b1, s10, s11)


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
    """Last correction ``(-1)^t1 (v_1 - v_0 - V_alpha)`` of every key (``v_b`` the leaf values).

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
    """Eval inputs of one level: per point its chosen child's seed block, the node's value blocks.

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
            out[base + 1 + q, 1] = hi ^ (VALUE | np.uint64(q))


@njit(cache=True, nogil=True)
def eval_step(  # noqa: PLR0913
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
    inp: np.ndarray,
) -> None:  # pragma: no cover - numba
    """:func:`eval_level` fused with the next level's :func:`eval_blocks` (the same points).

    Reads only the ciphertexts ``enc`` (inputs recomputed from ``seeds``, which still hold
    this level's seeds); updates ``seeds``, ``t``, ``acc`` and, below the last level, writes
    the next level's AES inputs into ``inp``.
    """
    tau = acc.shape[1]
    nq = n_blocks - 1
    shift = np.uint64(domain_bits - 1 - level)
    more = level + 1 < domain_bits
    nshift = np.uint64(domain_bits - 2 - level) if more else np.uint64(0)
    neg = ZERO - np.uint64(party)  # party 1 subtracts: (v ^ neg) - neg == -v
    for i in range(seeds.shape[0]):
        j = key_idx[i]
        pt = points[i]
        c = (pt >> shift) & ONE
        base = i * n_blocks
        lo = seeds[i, 0]
        hi = seeds[i, 1]
        w0 = enc[base, 0] ^ lo
        tc = np.uint8(w0 & ONE)
        s0 = w0 & CLEAR
        s1 = enc[base, 1] ^ hi ^ (SEED | c)
        tt = t[i]
        mt = ZERO - np.uint64(tt)  # all ones where the control bit is set
        for w in range(tau):
            q = w >> 1
            v = _ff(enc, base + 1 + q, w & 1, lo, hi, VALUE | np.uint64(q))
            v += cw_values[level, j, w] & mt
            acc[i, w] += (v ^ neg) - neg
        s0 ^= cw_seeds[level, j, 0] & mt
        s1 ^= cw_seeds[level, j, 1] & mt
        tc ^= (cw_bits[level, j] >> np.uint8(c)) & tt
        seeds[i, 0] = s0
        seeds[i, 1] = s1
        t[i] = tc
        if more:
            c2 = (pt >> nshift) & ONE
            inp[base, 0] = s0
            inp[base, 1] = s1 ^ (SEED | c2)
            for q in range(nq):
                inp[base + 1 + q, 0] = s0
                inp[base + 1 + q, 1] = s1 ^ (VALUE | np.uint64(q))


@njit(cache=True, nogil=True)
def eval_step_tau2(  # noqa: PLR0913
    enc: np.ndarray,
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
    inp: np.ndarray,
) -> None:  # pragma: no cover - numba
    """:func:`eval_step` for ``tau = 2`` (two blocks per point), unrolled: the same words.

    ``enc`` and ``inp`` are flat words at unsigned offsets (no negative-index checks).
    """
    e = enc.reshape(-1)
    ip = inp.reshape(-1)
    fs = cw_seeds.reshape(-1)
    fv = cw_values.reshape(-1)
    fb = cw_bits.reshape(-1)
    row = np.uint64(level) * np.uint64(cw_bits.shape[1])
    shift = np.uint64(domain_bits - 1 - level)
    more = level + 1 < domain_bits
    nshift = np.uint64(domain_bits - 2 - level) if more else np.uint64(0)
    neg = ZERO - np.uint64(party)
    for ii in range(seeds.shape[0]):
        i = np.uint64(ii)
        at = row + np.uint64(key_idx[i])  # the key's correction of this level
        pt = points[i]
        c = (pt >> shift) & ONE
        base = FOUR * i
        lo = seeds[i, 0]
        hi = seeds[i, 1]
        w0 = e[base] ^ lo
        tt = t[i]
        mt = ZERO - np.uint64(tt)
        v0 = (e[base + TWO] ^ lo) + (fv[TWO * at] & mt)
        v1 = (e[base + THREE] ^ hi ^ VALUE) + (fv[TWO * at + ONE] & mt)
        acc[i, 0] += (v0 ^ neg) - neg
        acc[i, 1] += (v1 ^ neg) - neg
        s0 = (w0 & CLEAR) ^ (fs[TWO * at] & mt)
        s1 = e[base + ONE] ^ hi ^ (SEED | c) ^ (fs[TWO * at + ONE] & mt)
        seeds[i, 0] = s0
        seeds[i, 1] = s1
        t[i] = np.uint8(w0 & ONE) ^ ((fb[at] >> np.uint8(c)) & tt)
        if more:
            c2 = (pt >> nshift) & ONE
            ip[base] = s0
            ip[base + ONE] = s1 ^ (SEED | c2)
            ip[base + TWO] = s0
            ip[base + THREE] = s1 ^ VALUE


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
    """``V += (-1)^b (v(s) + t * CW_final)`` for every point (leaf value blocks at ``i * nq``)."""
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


@njit(cache=True, nogil=True)
def public_is_canonical(cw_seeds: np.ndarray, cw_bits: np.ndarray) -> bool:  # pragma: no cover
    """Whether every seed correction has bit 0 clear and every bit correction is in ``0..3``.

    One pass over the ``(n, m, 2)`` seed and ``(n, m)`` bit corrections (numpy's reductions
    over the strided low bytes took ~3x as long), stopping at the first bad entry.
    """
    n, m = cw_bits.shape
    for level in range(n):
        for j in range(m):
            if (cw_seeds[level, j, 0] & ONE) or cw_bits[level, j] > 3:
                return False
    return True
