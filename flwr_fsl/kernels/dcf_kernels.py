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
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from flwr_fsl.kernels.dpf_vectors import _v2, _v2_ptr

ZERO = np.uint64(0)
ONE = np.uint64(1)
CLEAR = ~np.uint64(1)
SEED = np.uint64(1 << 32)
VALUE = np.uint64(2 << 32)
LEAF = np.uint64(3 << 32)
TWO, THREE, SIXTEEN, NINETY_SIX = (np.uint64(k) for k in (2, 3, 16, 96))
GEN_STATE_WORDS = 8
"""Words of one key's ``tau = 2`` Gen state row: both seeds, ``V_alpha``, ``t0``, ``t1``."""


# ------------------------------------------------------------------------------------------------
# 128-bit forms of the tau = 2 steps: one key (Gen) or one point (Eval) per intrinsic call.
# numba's scalar code for the same words was not vectorized by LLVM (two 8-byte loads, XORs and
# stores per block, ~190 instructions per Gen key and level with spills); a block here is one
# ``<2 x i64>`` (element 0 = word 0, the lower address). Loads and stores claim no alignment: the
# public part's fields may be unaligned views of a message (public_views); x86 emits the same
# unaligned vector moves either way.
# ------------------------------------------------------------------------------------------------


def _const2(lo: int, hi: int) -> ir.Constant:
    """Return the ``<2 x i64>`` constant ``(lo, hi)`` (two's complement words)."""
    i64 = ir.IntType(64)
    return ir.Constant(ir.VectorType(i64, 2), [ir.Constant(i64, lo), ir.Constant(i64, hi)])


def _ld(builder: ir.IRBuilder, addr: ir.Value, offset: ir.Value | int = 0) -> ir.Value:
    """Load the block at byte address ``addr + offset`` (``offset`` an int or an ``i64``)."""
    if isinstance(offset, int):
        offset = ir.Constant(ir.IntType(64), offset)
    return builder.load(_v2_ptr(builder, builder.add(addr, offset)), align=1)


def _st(builder: ir.IRBuilder, addr: ir.Value, offset: int, value: ir.Value) -> None:
    """Store the block ``value`` at byte address ``addr + offset``."""
    ptr = _v2_ptr(builder, builder.add(addr, ir.Constant(ir.IntType(64), offset)))
    builder.store(value, ptr, align=1)


def _lo(builder: ir.IRBuilder, vec: ir.Value) -> ir.Value:
    """Word 0 of a block."""
    return builder.extract_element(vec, ir.Constant(ir.IntType(32), 0))


_SEED, _VALUE = int(SEED), int(VALUE)
_CLEAR_LO = _const2(-2, -1)  # clears bit 0 of word 0 (a seed's control bit)


@intrinsic
def _gen_key_tau2(typingctx, ptrs, a):  # type: ignore[no-untyped-def]
    """One key's Gen step at ``tau = 2`` (:func:`gen_step_tau2`'s words) on 128-bit blocks.

    ``ptrs`` are the byte addresses ``(enc, state, beta, cw_seed, cw_value, inp, cw_bit)`` of
    the key's six ciphertext blocks (party 0's left, right, value, then party 1's), its
    64-byte state row (both parties' seeds, ``V_alpha``, both control bits as words:
    :data:`GEN_STATE_WORDS`; updated), its ``beta``, its seed and value corrections of this
    level (written), its six next-level AES inputs (written) and its bit correction byte
    (written); ``a`` is alpha's bit of this level. One pointer to the key's whole state (one
    cache line) keeps the loop's pointers in registers: with separate seed, ``V_alpha`` and
    control-bit arrays LLVM spilled them to the stack.
    """
    u64 = types.uint64
    sig = types.void(types.UniTuple(u64, 7), u64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        e_p, s_p, b_p, cws_p, cwv_p, ip_p, cb_p = (
            builder.extract_value(args[0], k) for k in range(7)
        )
        a = args[1]
        i64 = ir.IntType(64)
        one, zero = ir.Constant(i64, 1), ir.Constant(i64, 0)

        def word(offset: int) -> ir.Value:
            ptr = builder.inttoptr(builder.add(s_p, ir.Constant(i64, offset)), i64.as_pointer())
            return ptr

        t0, t1 = builder.load(word(48), align=8), builder.load(word(56), align=8)
        keep_off = builder.shl(a, ir.Constant(i64, 4))  # the kept child's block: 16 a bytes
        lose_off = builder.sub(ir.Constant(i64, 16), keep_off)
        s0, s1 = _ld(builder, s_p), _ld(builder, s_p, 16)
        d = builder.xor(s0, s1)
        # party 0's blocks at e_p, party 1's at e_p + 48; the tweaks cancel between parties
        x0l = builder.xor(_ld(builder, e_p, lose_off), s0)
        x1l = builder.xor(_ld(builder, builder.add(e_p, ir.Constant(i64, 48)), lose_off), s1)
        cw = builder.and_(builder.xor(x0l, x1l), _CLEAR_LO)
        _st(builder, cws_p, 0, cw)
        left = _lo(builder, builder.xor(builder.xor(_ld(builder, e_p), _ld(builder, e_p, 48)), d))
        right = _lo(
            builder, builder.xor(builder.xor(_ld(builder, e_p, 16), _ld(builder, e_p, 64)), d)
        )
        t_left = builder.and_(builder.xor(builder.xor(left, a), one), one)
        t_right = builder.and_(builder.xor(right, a), one)
        # the node's value, each party: H(s ^ (0, VALUE)) = enc ^ s ^ (0, VALUE)
        tw_v = _const2(0, _VALUE)
        v0 = builder.xor(builder.xor(_ld(builder, e_p, 32), s0), tw_v)
        v1 = builder.xor(builder.xor(_ld(builder, e_p, 80), s1), tw_v)
        ma = builder.sub(zero, a)
        ba = builder.and_(_ld(builder, b_p), _v2(builder, ma, ma))
        raw = builder.add(builder.sub(builder.sub(v1, v0), _ld(builder, s_p, 32)), ba)
        m0, m1 = builder.sub(zero, t0), builder.sub(zero, t1)
        m1v = _v2(builder, m1, m1)
        _st(builder, cwv_p, 0, builder.sub(builder.xor(raw, m1v), m1v))
        _st(builder, s_p, 32, ba)
        bits = builder.or_(t_left, builder.shl(t_right, one))
        cb = builder.inttoptr(cb_p, ir.IntType(8).as_pointer())
        builder.store(builder.trunc(bits, ir.IntType(8)), cb, align=1)
        t_keep = builder.xor(t_left, builder.and_(builder.xor(t_left, t_right), a))
        # the kept child of each party, corrected where its control bit is set
        tw_keep = _v2(builder, zero, builder.or_(ir.Constant(i64, _SEED), a))
        x0k = builder.xor(_ld(builder, e_p, keep_off), s0)
        x1k = builder.xor(_ld(builder, builder.add(e_p, ir.Constant(i64, 48)), keep_off), s1)
        tws = (_const2(0, _SEED), _const2(0, _SEED | 1), tw_v)
        for p, (x, m, t) in enumerate(((x0k, m0, t0), (x1k, m1, t1))):
            ns = builder.xor(
                builder.xor(builder.and_(x, _CLEAR_LO), tw_keep),
                builder.and_(cw, _v2(builder, m, m)),
            )
            _st(builder, s_p, 16 * p, ns)
            for k, tw in enumerate(tws):  # next level's inputs: left, right seed, value
                _st(builder, ip_p, 48 * p + 16 * k, builder.xor(ns, tw))
            nt = builder.xor(builder.and_(_lo(builder, x), one), builder.and_(t_keep, t))
            builder.store(nt, word(48 + 8 * p), align=8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _eval_point_tau2(typingctx, ptrs, words):  # type: ignore[no-untyped-def]
    """One point's Eval step at ``tau = 2`` (:func:`eval_step_tau2`'s words) on 128-bit blocks.

    ``ptrs`` are the byte addresses ``(enc, seed, cw_seed, cw_value, acc, inp)`` of the
    point's two ciphertext blocks (chosen child's seed, node value), its seed (updated), its
    key's seed and value corrections of this level, its two output words (added to) and its
    two next-level AES inputs (written); ``words`` are ``(mt, sc, sn, neg)``: all ones where
    the control bit is set, this level's seed tweak ``SEED | c``, the next level's ``SEED |
    c'``, and all ones for party 1 (which subtracts). Returns word 0 of the chosen child's
    block before the correction (its bit 0 is the uncorrected control bit).
    """
    u64 = types.uint64
    sig = u64(types.UniTuple(u64, 6), types.UniTuple(u64, 4))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        e_p, s_p, cws_p, cwv_p, acc_p, ip_p = (builder.extract_value(args[0], k) for k in range(6))
        mt, sc, sn, neg = (builder.extract_value(args[1], k) for k in range(4))
        zero = ir.Constant(ir.IntType(64), 0)
        s = _ld(builder, s_p)
        mtv = _v2(builder, mt, mt)
        negv = _v2(builder, neg, neg)
        x = builder.xor(_ld(builder, e_p), s)
        v = builder.xor(builder.xor(_ld(builder, e_p, 16), s), _const2(0, _VALUE))
        v = builder.add(v, builder.and_(_ld(builder, cwv_p), mtv))
        acc = builder.add(_ld(builder, acc_p), builder.sub(builder.xor(v, negv), negv))
        _st(builder, acc_p, 0, acc)
        ns = builder.xor(builder.and_(x, _CLEAR_LO), _v2(builder, zero, sc))
        ns = builder.xor(ns, builder.and_(_ld(builder, cws_p), mtv))
        _st(builder, s_p, 0, ns)
        _st(builder, ip_p, 0, builder.xor(ns, _v2(builder, zero, sn)))
        _st(builder, ip_p, 16, builder.xor(ns, _const2(0, _VALUE)))
        return _lo(builder, x)

    return sig, codegen


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


@njit(cache=True, nogil=True)
def gen_step_tau2(
    enc: np.ndarray,
    level: int,
    domain_bits: int,
    lo: int,
    keys: tuple[np.ndarray, np.ndarray],
    state: np.ndarray,
    cws: tuple[np.ndarray, np.ndarray, np.ndarray],
    inp: np.ndarray,
) -> None:  # pragma: no cover - numba
    """:func:`gen_step` for ``tau = 2`` (one value block per node): the same words.

    The ReLU of :mod:`flwr_fsl.families.privhfl` uses ``tau = 2``. ``keys`` are the whole
    batch's ``(alphas, betas)``; the chunk's seeds, control bits and ``V_alpha`` are one
    ``(m, GEN_STATE_WORDS)`` ``state`` array (:func:`pack_gen_state`); ``cws`` are
    ``(cw_seeds, cw_values, cw_bits)``. Each key's step
    runs on 128-bit blocks (:func:`_gen_key_tau2`: no branch on a secret bit). Below the last
    level it writes the next level's inputs into ``inp``; at the last level it writes them
    too (rows the leaf pass overwrites or never encrypts), which saves a branch per key. All
    arrays are C-contiguous.
    """
    alphas, betas = keys
    cw_seeds, cw_values, cw_bits = cws
    shift = np.uint64(domain_bits - 1 - level)
    at0 = np.uint64(level) * np.uint64(cw_bits.shape[1]) + np.uint64(lo)  # this level's row
    e_p = np.uint64(enc.ctypes.data)
    s_p = np.uint64(state.ctypes.data)
    b_p = np.uint64(betas.ctypes.data) + SIXTEEN * np.uint64(lo)
    cs_p = np.uint64(cw_seeds.ctypes.data) + SIXTEEN * at0
    cv_p = np.uint64(cw_values.ctypes.data) + SIXTEEN * at0
    cb_p = np.uint64(cw_bits.ctypes.data) + at0
    ip_p = np.uint64(inp.ctypes.data)
    for jj in range(state.shape[0]):
        j = np.uint64(jj)
        a = (alphas[np.uint64(lo) + j] >> shift) & ONE
        o16 = SIXTEEN * j
        o96 = NINETY_SIX * j
        ptrs = (e_p + o96, s_p + o16 * np.uint64(4), b_p + o16, cs_p + o16, cv_p + o16,
                ip_p + o96, cb_p + j)  # fmt: skip
        _gen_key_tau2(ptrs, a)  # type: ignore[call-arg]


@njit(cache=True, nogil=True)
def pack_gen_state(
    seeds: np.ndarray, t: np.ndarray, v_alpha: np.ndarray, state: np.ndarray
) -> None:  # pragma: no cover - numba
    """Write ``(m, 2, 2)`` seeds, ``(m, 2)`` control bits and ``(m, 2)`` ``V_alpha`` as rows.

    A ``state`` of no rows (the drivers' at ``tau != 2``) leaves the arrays alone.
    """
    for j in range(state.shape[0]):
        state[j, 0] = seeds[j, 0, 0]
        state[j, 1] = seeds[j, 0, 1]
        state[j, 2] = seeds[j, 1, 0]
        state[j, 3] = seeds[j, 1, 1]
        state[j, 4] = v_alpha[j, 0]
        state[j, 5] = v_alpha[j, 1]
        state[j, 6] = np.uint64(t[j, 0])
        state[j, 7] = np.uint64(t[j, 1])


@njit(cache=True, nogil=True)
def unpack_gen_state(
    state: np.ndarray, seeds: np.ndarray, t: np.ndarray, v_alpha: np.ndarray
) -> None:  # pragma: no cover - numba
    """Copy the rows back into the arrays (for the leaf pass and :func:`gen_final`)."""
    for j in range(state.shape[0]):
        seeds[j, 0, 0] = state[j, 0]
        seeds[j, 0, 1] = state[j, 1]
        seeds[j, 1, 0] = state[j, 2]
        seeds[j, 1, 1] = state[j, 3]
        v_alpha[j, 0] = state[j, 4]
        v_alpha[j, 1] = state[j, 5]
        t[j, 0] = np.uint8(state[j, 6])
        t[j, 1] = np.uint8(state[j, 7])


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
) -> np.uint64:  # pragma: no cover - numba
    """:func:`eval_step` for ``tau = 2`` (two blocks per point): the same words.

    Each point's step runs on 128-bit blocks (:func:`_eval_point_tau2`). At the last level
    the next inputs are written too (rows the leaf pass overwrites or never encrypts). The
    arrays are C-contiguous (``acc`` a row range of a C-contiguous array).

    Returns the :func:`public_flags` of the corrections it read (the canonical check of a
    deferred decode, folded into this pass: the words are in L1 already).
    """
    row = np.uint64(level) * np.uint64(cw_bits.shape[1])
    fs = cw_seeds.reshape(-1)
    s_or = ZERO
    b_or = np.uint8(0)
    shift = np.uint64(domain_bits - 1 - level)
    nshift = np.uint64(domain_bits - 2 - level) if level + 1 < domain_bits else ZERO
    neg = ZERO - np.uint64(party)
    fb = cw_bits.reshape(-1)
    e_p = np.uint64(enc.ctypes.data)
    s_p = np.uint64(seeds.ctypes.data)
    cs_p = np.uint64(cw_seeds.ctypes.data)
    cv_p = np.uint64(cw_values.ctypes.data)
    acc_p = np.uint64(acc.ctypes.data)
    ip_p = np.uint64(inp.ctypes.data)
    for ii in range(seeds.shape[0]):
        i = np.uint64(ii)
        at = row + np.uint64(key_idx[i])  # the key's correction of this level
        pt = points[i]
        c = (pt >> shift) & ONE
        tt = t[i]
        o16 = SIXTEEN * i
        o32 = o16 + o16
        ptrs = (e_p + o32, s_p + o16, cs_p + SIXTEEN * at, cv_p + SIXTEEN * at, acc_p + o16,
                ip_p + o32)  # fmt: skip
        words = (ZERO - np.uint64(tt), SEED | c, SEED | ((pt >> nshift) & ONE), neg)
        w0: np.uint64 = _eval_point_tau2(ptrs, words)  # type: ignore[call-arg]
        cb = fb[at]
        t[i] = np.uint8(w0 & ONE) ^ ((cb >> np.uint8(c)) & tt)
        s_or |= fs[TWO * at]
        b_or |= cb
    return (s_or & ONE) | (np.uint64(b_or) & ~THREE)


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
def public_flags(cw_seeds: np.ndarray, cw_bits: np.ndarray) -> np.uint64:  # pragma: no cover
    """Return the non-canonical flags of corrections (0: canonical).

    Bit 0: a seed correction has bit 0 set; bits 2..7: a bit correction is above 3. One
    pass over the ``(n, m, 2)`` seed and ``(n, m)`` bit corrections: ORs without a branch
    per entry (LLVM vectorizes them; the pass is bound by memory).
    """
    fs = cw_seeds.reshape(-1)
    fb = cw_bits.reshape(-1)
    s_or = ZERO
    for i in range(0, fs.shape[0], 2):
        s_or |= fs[i]
    b_or = np.uint8(0)
    for i in range(fb.shape[0]):
        b_or |= fb[i]
    return (s_or & ONE) | (np.uint64(b_or) & ~THREE)


@njit(cache=True, nogil=True)
def open_points(
    mine: np.ndarray, peer: np.ndarray, domain_bits: int, x_hat: np.ndarray, points: np.ndarray
) -> None:  # pragma: no cover - numba
    """PrivHFL's opened ``x^ = mine + peer`` (mod ``2^64``) and the DCF points ``x^ mod 2^l``."""
    mask = (ONE << np.uint64(domain_bits)) - ONE
    for i in range(mine.shape[0]):
        x = mine[i] + peer[i]
        x_hat[i] = x
        points[i] = x & mask


@njit(cache=True, nogil=True)
def relu_shares(
    x_hat: np.ndarray,
    dcf_out: np.ndarray,
    shares: tuple[np.ndarray, np.ndarray, np.ndarray],
    domain_bits: int,
    party: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - numba
    """One party's share of ``ReLU(x) = x^ DReLU - [p r + (1-2p) r q + (1-2p) r (1-2q) c]``.

    ``x^`` is the opened ``x + r``, ``dcf_out`` the ``(n, 2)`` DCF shares, ``shares`` the
    party's ``(r, q, r q)`` shares; ``p`` is bit ``l`` of ``x^ + 2^l``. One pass, the words
    of :class:`flwr_fsl.families.privhfl.ops`' numpy form (all mod ``2^64``).
    """
    r, q, rq = shares
    l_bits = np.uint64(domain_bits)
    half = ONE << l_bits
    own = np.uint64(1 - party)  # party 0 adds p to its DReLU share
    for i in range(x_hat.shape[0]):
        x = x_hat[i]
        p = ((x + half) >> l_bits) & ONE
        sign = ONE - TWO * p
        drelu = sign * (q[i] + dcf_out[i, 0]) + (p & (ZERO - own))
        bxr = sign * (rq[i] + dcf_out[i, 1]) + p * r[i]
        out[i] = x * drelu - bxr
