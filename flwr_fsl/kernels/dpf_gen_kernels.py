"""Numba loops of DPF key generation (BGI16 Gen), between the batched AES calls of a tree level.

The driver (:mod:`flwr_fsl.crypto.dpf_gen`) keeps both parties' blocks of a chunk of keys in one
buffer (party ``b``'s block of the chunk's ``i``-th key at row ``2 * i + b``; the block is the
seed with the node's control bit in bit 0, as in :mod:`flwr_fsl.kernels.dpf_kernels`), encrypts
it under the left and the right fixed key, and calls :func:`gen_level`, which finishes the MMO
feed-forward, writes the level's correction words straight into the keys' rows of the wire blob
and replaces each block by its kept child's (branch-free, reading the chunk's per-key arrays in
order; the control bits are packed for the wire once, after all levels). The leaf kernels lay
out the conversion inputs and, after one AES call, write the leaf correction words in place.

The kernels read the control bits from the blocks' bit 0, so no separate control-bit state is
carried between levels. Everything is ``uint64``/``uint8``/``int64`` with explicit casts, every
kernel is ``cache=True, nogil=True`` and writes into buffers the caller owns.

:func:`gen_run` is the whole chunk loop in one GIL-free call: the same kernels in the same order
on the same buffers, with OpenSSL's AES called natively between them
(:func:`~flwr_fsl.kernels.aes.native_encrypt`) instead of from Python, so the keys are
bit-identical to the Python driver's (:mod:`flwr_fsl.crypto.dpf_gen`, which keeps that driver
wherever ``libcrypto`` does not load).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.kernels.aes import log_blocks, native_encrypt
from flwr_fsl.kernels.dpf_kernels import gen_init
from flwr_fsl.kernels.dpf_vectors import _v2, _v2_ptr
from flwr_fsl.kernels.vdpf_kernels import BLOCKS, gen_proof_inputs, gen_proof_words

ZERO = np.uint64(0)
ONE = np.uint64(1)
TWO = np.uint64(2)
CLEAR = ~np.uint64(1)


@intrinsic
def _gen_key_level(typingctx, s_p, l_p, r_p, bit, cw_p):  # type: ignore[no-untyped-def]
    """One key's Gen level on 128-bit vectors; returns its packed control-bit correction.

    ``s_p`` addresses both parties' blocks of the key (party 0's, then party 1's: 32 bytes),
    ``l_p``/``r_p`` their encryptions under the left/right key, ``bit`` is the path bit
    (``1``: keep the right child) and ``cw_p`` the 16 bytes of the level's seed correction.
    The children are ``enc ^ s`` (MMO feed-forward); the correction is the lost children's
    XOR with bit 0 clear; each party's block becomes its kept child, corrected (the seed
    correction with the kept side's control-bit correction in bit 0) where its control bit
    is set. Returns ``tcw_l | tcw_r << 1``. numba's scalar form of the same words was not
    vectorized by LLVM (:func:`~flwr_fsl.kernels.dpf_vectors._mmo_children`'s reason).
    """
    sig = types.uint64(*([types.uint64] * 5))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        s_p, l_p, r_p, bit, cw_p = args
        i64, i32 = ir.IntType(64), ir.IntType(32)
        one, zero = ir.Constant(i64, 1), ir.Constant(i64, 0)

        def load(addr, k):  # type: ignore[no-untyped-def]
            ptr = builder.gep(_v2_ptr(builder, addr), [ir.Constant(i64, k)])
            return builder.load(ptr, align=8)

        sa, sb = load(s_p, 0), load(s_p, 1)
        la, lb = builder.xor(load(l_p, 0), sa), builder.xor(load(l_p, 1), sb)
        ra, rb = builder.xor(load(r_p, 0), sa), builder.xor(load(r_p, 1), sb)
        keep = builder.sub(zero, bit)  # all ones: keep the right child
        keep_v = _v2(builder, keep, keep)
        ka = builder.xor(la, builder.and_(builder.xor(la, ra), keep_v))
        kb = builder.xor(lb, builder.and_(builder.xor(lb, rb), keep_v))
        x, y = builder.xor(la, lb), builder.xor(ra, rb)
        lost = builder.xor(builder.xor(x, y), builder.xor(ka, kb))
        scw = builder.and_(lost, _v2(builder, ir.Constant(i64, -2), ir.Constant(i64, -1)))
        builder.store(scw, _v2_ptr(builder, cw_p), align=8)
        x0 = builder.extract_element(x, ir.Constant(i32, 0))
        y0 = builder.extract_element(y, ir.Constant(i32, 0))
        tcw_l = builder.xor(builder.xor(builder.and_(x0, one), bit), one)
        tcw_r = builder.xor(builder.and_(y0, one), bit)
        tcw_keep = builder.xor(tcw_l, builder.and_(builder.xor(tcw_l, tcw_r), keep))
        corr = builder.or_(scw, _v2(builder, tcw_keep, zero))
        out = _v2_ptr(builder, s_p)
        for k, (kept, s) in enumerate(((ka, sa), (kb, sb))):
            # A party whose control bit is set applies the correction (its bit included).
            m = builder.sub(
                zero, builder.and_(builder.extract_element(s, ir.Constant(i32, 0)), one)
            )
            new = builder.xor(kept, builder.and_(corr, _v2(builder, m, m)))
            builder.store(new, builder.gep(out, [ir.Constant(i64, k)]), align=8)
        return builder.or_(tcw_l, builder.shl(tcw_r, one))

    return sig, codegen


@njit(cache=True, nogil=True)
def gen_level(
    enc: np.ndarray,
    seeds: np.ndarray,
    level: int,
    path_bits: np.ndarray,
    depth: np.ndarray,
    rows: np.ndarray,
    cw_seeds: np.ndarray,
    cw_bits: np.ndarray,
) -> None:  # pragma: no cover - numba
    """One BGI16 Gen level for the chunk's first ``n = len(path_bits)`` keys (the deeper ones).

    ``enc[0]`` and ``enc[1]`` hold the blocks' encryptions under the left and the right key.
    Key ``i`` of the chunk has ``depth[i]`` tree levels, the path bits ``path_bits[i]`` (MSB
    first) and its first correction word at row ``rows[i]`` of ``cw_seeds`` / ``cw_bits``
    (the wire blob's rows); this level's goes to row ``rows[i] + level``. Branch-free, with
    the chunk's per-key arrays read in order; each key's words on 128-bit vectors
    (:func:`_gen_key_level`; ``seeds``, ``enc`` and ``cw_seeds`` are C-contiguous).
    """
    if not (seeds.flags.c_contiguous and enc.flags.c_contiguous and cw_seeds.flags.c_contiguous):
        raise ConfigurationError("gen_level reads its arrays by address: C-contiguous only")
    s_base = np.uint64(seeds.ctypes.data)
    l_base = np.uint64(enc[0].ctypes.data)
    r_base = np.uint64(enc[1].ctypes.data)
    c_base = np.uint64(cw_seeds.ctypes.data)
    for i in range(path_bits.shape[0]):
        bit = (path_bits[i] >> np.uint64(depth[i] - 1 - level)) & ONE
        row = rows[i] + level
        at = np.uint64(32 * i)  # both parties' blocks of key i
        cw = c_base + np.uint64(16 * row)
        tcw = _gen_key_level(s_base + at, l_base + at, r_base + at, bit, cw)  # type: ignore[call-arg, var-annotated]
        cw_bits[row] = np.uint8(tcw)


@njit(cache=True, nogil=True)
def gen_leaf_blocks(
    n: int, seeds: np.ndarray, epoch: np.uint64, half_w: int, out: np.ndarray
) -> None:  # pragma: no cover - numba
    """Conversion inputs ``s_b ^ (2 + q, epoch)``, ``q < half_w``, of both parties' leaf seeds."""
    for k in range(2 * n):
        s0 = seeds[k, 0] & CLEAR
        s1 = seeds[k, 1] ^ epoch
        base = k * half_w
        for q in range(half_w):
            out[base + q, 0] = s0 ^ (TWO + np.uint64(q))
            out[base + q, 1] = s1


@njit(cache=True, nogil=True)
def gen_leaf_correction(
    enc: np.ndarray,
    blocks: np.ndarray,
    keys: np.ndarray,
    seeds: np.ndarray,
    group_pos: np.ndarray,
    betas: np.ndarray,
    cw_leaf: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Leaf correction ``CW = (-1)^t1 * (u - H(s0) + H(s1))``, ``u = beta`` at its group.

    ``t1`` is party 1's final control bit (bit 0 of its leaf block ``seeds[2 * i + 1]``);
    ``u`` is ``beta`` (``tau`` words) at word offset ``group_pos[j] * tau``, 0 elsewhere; key
    ``i`` of the chunk is key number ``keys[i]``, its ``W = cw_leaf.shape[1]`` words come from
    ``W / 2`` blocks per party (:func:`gen_leaf_blocks`).
    """
    tau = betas.shape[1]
    width = cw_leaf.shape[1]
    half_w = width // 2
    for i in range(keys.shape[0]):
        j = keys[i]
        start = group_pos[j] * tau
        neg = (seeds[2 * i + 1, 0] & ONE) != ZERO
        base0 = (2 * i) * half_w
        base1 = (2 * i + 1) * half_w
        for w in range(width):
            q = w >> 1
            h = w & 1
            c0 = enc[base0 + q, h] ^ blocks[base0 + q, h]
            c1 = enc[base1 + q, h] ^ blocks[base1 + q, h]
            u = ZERO
            if start <= w < start + tau:
                u = betas[j, w - start]
            val = u - c0 + c1
            if neg:
                val = ZERO - val
            cw_leaf[j, w] = val


@njit(cache=True, nogil=True)
def gen_plan(
    alphas: np.ndarray,
    dbits: np.ndarray,
    levels: np.ndarray,
    offsets: np.ndarray,
    group: int,
    chunk: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """Key order and per-key geometry of a Gen call, in one pass plus a counting sort per chunk.

    ``levels[j]`` is key ``j``'s tree levels and ``offsets[j]`` its first correction-word row.
    Returns ``(order, depth, path, rows, group_pos)``: the key numbers chunk by chunk of
    ``chunk`` consecutive keys, each chunk's keys by decreasing depth (ties in key order, as a
    stable sort), so a chunk's keys that have a given level are a prefix of it and everything
    a chunk reads and writes per key stays in a window of ``chunk`` keys; the depth, tree-path
    bits (MSB first) and first row of each key *in that order*; and each key's position of
    ``alpha`` in its leaf group (by key number; with ``group == 2`` and a tree, the last bit
    of ``alpha``).
    """
    m = levels.shape[0]
    order = np.empty(m, dtype=np.int64)
    depth = np.empty(m, dtype=np.int64)
    path = np.empty(m, dtype=np.uint64)
    rows = np.empty(m, dtype=np.int64)
    gpos = np.zeros(m, dtype=np.int64)
    counts = np.zeros(66, dtype=np.int64)
    start = np.empty(66, dtype=np.int64)
    for lo in range(0, m, max(chunk, 1)):
        hi = min(m, lo + chunk)
        counts[:] = 0
        for j in range(lo, hi):
            counts[levels[j]] += 1
        pos = lo
        for d in range(65, -1, -1):
            start[d] = pos
            pos += counts[d]
        for j in range(lo, hi):
            d = levels[j]
            p = start[d]
            start[d] = p + 1
            a = alphas[j]
            if group == 2:
                if dbits[j] >= 1:
                    gpos[j] = np.int64(a & ONE)
                    a = a >> ONE
                else:
                    a = ZERO
            order[p] = j
            depth[p] = d
            path[p] = a
            rows[p] = offsets[j]
    return order, depth, path, rows, gpos


@njit(cache=True, nogil=True)
def _gen_chunk_levels(
    fn: int,
    ctxs: np.ndarray,
    geom: tuple[np.ndarray, np.ndarray, np.ndarray],
    lo: int,
    n: int,
    bufs: tuple[np.ndarray, np.ndarray, np.ndarray],
    outs: tuple[np.ndarray, np.ndarray],
    log: np.ndarray,
) -> int:  # pragma: no cover - numba
    """Every tree level of the chunk ``lo:lo + n`` (keys by decreasing depth); see :func:`gen_run`.

    ``bufs`` is ``(seeds, enc, count)``, ``count[0]`` the AES calls made before. Returns the
    AES call count after the chunk's levels, or ``-1`` if OpenSSL failed.
    """
    depth_s, path_s, rows_s = geom
    seeds, enc, count = bufs
    cw_seeds, cw_bits = outs
    n_log = count[0]
    outl = np.zeros(1, dtype=np.int32)
    active = n
    for level in range(depth_s[lo] if n else 0):
        # depth is non-increasing: the keys that have level `level` are a prefix.
        while active > 0 and depth_s[lo + active - 1] <= level:
            active -= 1
        if not native_encrypt(fn, ctxs[0], seeds, enc[0], 2 * active, outl):
            return -1
        if not native_encrypt(fn, ctxs[1], seeds, enc[1], 2 * active, outl):
            return -1
        n_log = log_blocks(log, log_blocks(log, n_log, 2 * active), 2 * active)
        hi = lo + active
        path, depth, rows = path_s[lo:hi], depth_s[lo:hi], rows_s[lo:hi]
        gen_level(enc, seeds, level, path, depth, rows, cw_seeds, cw_bits)
    return n_log


@njit(cache=True, nogil=True)
def gen_run(
    fn: int,
    ctxs: np.ndarray,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    geom: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    outs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    shape: np.ndarray,
    epoch: np.uint64,
    log: np.ndarray,
) -> int:  # pragma: no cover - numba
    """BGI16 Gen of all keys, chunk by chunk (each deepest keys first), AES called natively.

    ``fn`` is ``EVP_EncryptUpdate``'s address and ``ctxs`` the ``(4,)`` left, right, value and
    proof contexts; ``inputs`` is ``(alphas, betas, root0, root1, group_pos)``; ``geom`` is
    ``(order, depth, path, rows)`` with the last three already in ``order`` (:func:`gen_plan`'s,
    made for this ``chunk``: each chunk's keys by decreasing depth); ``outs`` is ``(cw_seeds,
    cw_bits, cw_leaf, cw_proof)`` (``cw_proof`` may have no rows when ``shape[2]`` is 0);
    ``shape`` is ``(chunk, half_w, proof)``. Returns the number of AES calls made (``log``
    receives their block counts, as many as fit) or ``-1`` if OpenSSL failed.
    """
    alphas, betas, root0, root1, gpos = inputs
    order, depth_s, path_s, rows_s = geom
    cw_seeds, cw_bits, cw_leaf, cw_proof = outs
    chunk, half_w, proof = shape[0], shape[1], shape[2] != 0
    m = order.shape[0]
    seeds = np.empty((2 * chunk, 2), dtype=np.uint64)
    enc = np.empty((2, 2 * chunk + 1, 2), dtype=np.uint64)
    conv = np.empty((2 * chunk * half_w, 2), dtype=np.uint64)
    conv_enc = np.empty((2 * chunk * half_w + 1, 2), dtype=np.uint64)
    state_t = np.empty((chunk, 2), dtype=np.uint8)
    n_p = 2 * chunk * BLOCKS if proof else 0
    p_in = np.empty((n_p, 2), dtype=np.uint64)
    p_enc = np.empty((n_p + 1, 2), dtype=np.uint64)
    outl = np.zeros(1, dtype=np.int32)
    count = np.zeros(1, dtype=np.int64)
    n_log = 0
    for lo in range(0, m, chunk):
        n = min(chunk, m - lo)
        gen_init(order, lo, n, root0, root1, state_t, seeds)
        count[0] = n_log
        n_log = _gen_chunk_levels(
            fn, ctxs, (depth_s, path_s, rows_s), lo, n, (seeds, enc, count),
            (cw_seeds, cw_bits), log,
        )  # fmt: skip
        if n_log < 0:
            return -1
        if proof:
            gen_proof_inputs(n, seeds, order, lo, alphas, p_in)
            if not native_encrypt(fn, ctxs[3], p_in, p_enc, 2 * n * BLOCKS, outl):
                return -1
            n_log = log_blocks(log, n_log, 2 * n * BLOCKS)
            gen_proof_words(p_enc, p_in, n, order, lo, cw_proof)
        gen_leaf_blocks(n, seeds, epoch, half_w, conv)
        if not native_encrypt(fn, ctxs[2], conv, conv_enc, 2 * n * half_w, outl):
            return -1
        n_log = log_blocks(log, n_log, 2 * n * half_w)
        gen_leaf_correction(conv_enc, conv, order[lo : lo + n], seeds, gpos, betas, cw_leaf)
    return n_log


@njit(cache=True, nogil=True)
def root_seeds(fn: int, ctx: int, tag: np.uint64, out: np.ndarray) -> bool:  # pragma: no cover
    """``AES_k(j || tag)`` with bit 0 cleared into ``out[j]`` for ``j < len(out) - 1``.

    The root seeds :func:`~flwr_fsl.crypto.prg.derive_root_seeds` derives (``ctx``: an ECB
    context under the master seed; ``out`` has one spare row for OpenSSL). Returns whether
    OpenSSL wrote every block.
    """
    m = out.shape[0] - 1
    outl = np.zeros(1, dtype=np.int32)
    step = 4096  # blocks per AES call (64 KiB in, in place of the output rows)
    for lo in range(0, m, step):
        n = min(step, m - lo)
        dst = out[lo:]
        for i in range(n):
            dst[i, 0] = np.uint64(lo + i)
            dst[i, 1] = tag
        if not native_encrypt(fn, ctx, dst, dst, n, outl):
            return False
        for i in range(n):
            dst[i, 0] &= CLEAR
    return True
