"""Numba loops of the verifiable DPF's leaf proofs (:mod:`flwr_fsl.crypto.vdpf`).

A leaf's proof is ``pi(x, blk) = H(x, blk) ^ t * cs`` with ``blk`` the leaf's 128-bit block
*with its control bit ``t`` in bit 0* (the layout of :mod:`flwr_fsl.kernels.dpf_kernels`) and
``H(x, blk)`` four fixed-key AES-MMO blocks under
:data:`~flwr_fsl.crypto.prg.MMO_KEY_PROOF`: block ``q`` hashes
``(blk_lo ^ (q << 1), blk_hi ^ alpha^q * x)``, where ``alpha^q * x`` is ``x`` doubled ``q`` times
in GF(2^64) (polynomial ``x^64 + x^4 + x^3 + x + 1``). The tweak differences of two points
``x1 != x2`` are ``alpha^q * (x1 ^ x2)``, pairwise distinct over ``q``, so no XOR shift of a seed
maps all four blocks of one point onto another's (a plain ``(q, x)`` tweak would: the MMO
hash of ``s ^ T`` then only depends on ``s ^ T``).

The drivers lay out AES inputs (:func:`gen_proof_inputs`, :func:`fd_proof_inputs`), encrypt
them in one batched call, and finish the MMO feed-forward here (:func:`gen_proof_words`,
:func:`fd_proof_finish`). Conventions as in :mod:`flwr_fsl.kernels.dpf_kernels`.

The native checked evaluation's pass (:func:`proof_pass`) computes the same words per leaf
with 128-bit LLVM intrinsics (:func:`_proof_inputs`, :func:`_proof_words`, on
:mod:`~flwr_fsl.kernels.dpf_kernels`' ``_v2`` vectors), unsigned address arithmetic (no
negative-index selects), each task's correction words held in registers and the proofs
written with non-temporal stores: a segment's 4 MiB of proofs no longer evict the tree's
level buffers from the L2 cache, and their reader (the digest's GMAC) takes them from memory
anyway. ``benchmarks/vdpf_proof_bench.py`` prints its time per point beyond its AES against
an older tree (22.1 -> 10.5 ns in the run docs/families/ssa.md quotes; runs vary widely).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from flwr_fsl.kernels.aes import native_encrypt
from flwr_fsl.kernels.dpf_kernels import store_fence
from flwr_fsl.kernels.dpf_vectors import _emit_store_nt, _v2, _v2_ptr

ZERO = np.uint64(0)
ONE = np.uint64(1)
TWO = np.uint64(2)
CLEAR = ~np.uint64(1)
TOP = np.uint64(63)
REDUCE = np.uint64(0x1B)
BLOCKS = 4  # AES blocks (2 words each) of one leaf proof


@njit(cache=True, nogil=True)
def _dbl(x: np.uint64) -> np.uint64:  # pragma: no cover - numba
    """Multiply by ``alpha`` in GF(2^64) (shift left, reduce by ``x^4 + x^3 + x + 1``)."""
    return (x << ONE) ^ (REDUCE & (ZERO - (x >> TOP)))


@njit(cache=True, nogil=True)
def _write_inputs(
    lo_word: np.uint64, hi_word: np.uint64, x: np.uint64, out: np.ndarray, row: int
) -> None:  # pragma: no cover - numba
    """Write the four AES inputs of ``H(x, (lo_word, hi_word))`` at ``out[row:row + 4]``."""
    tweak = x
    for q in range(BLOCKS):
        out[row + q, 0] = lo_word ^ (np.uint64(q) << ONE)
        out[row + q, 1] = hi_word ^ tweak
        tweak = _dbl(tweak)


@njit(cache=True, nogil=True)
def gen_proof_inputs(
    n: int, seeds: np.ndarray, order: np.ndarray, lo: int, alphas: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - numba
    """Proof-hash inputs of both parties' leaf blocks at ``alpha`` (``seeds[2 * i + b]``)."""
    for i in range(n):
        x = alphas[order[lo + i]]
        for b in range(2):
            k = 2 * i + b
            _write_inputs(seeds[k, 0], seeds[k, 1], x, out, BLOCKS * k)


@njit(cache=True, nogil=True)
def gen_proof_words(
    enc: np.ndarray, inputs: np.ndarray, n: int, order: np.ndarray, lo: int, cw_proof: np.ndarray
) -> None:  # pragma: no cover - numba
    """``cs = H(alpha, blk_0) ^ H(alpha, blk_1)`` of each key of the chunk."""
    for i in range(n):
        j = order[lo + i]
        for q in range(BLOCKS):
            r0 = BLOCKS * (2 * i) + q
            r1 = BLOCKS * (2 * i + 1) + q
            for w in range(2):
                h0 = enc[r0, w] ^ inputs[r0, w]
                h1 = enc[r1, w] ^ inputs[r1, w]
                cw_proof[j, 2 * q + w] = h0 ^ h1


@njit(cache=True, nogil=True)
def fd_proof_inputs(
    conv: np.ndarray,
    t_in: np.ndarray,
    tasks_i: np.ndarray,
    key_first: np.ndarray,
    epochs: np.ndarray,
    half_w: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Proof-hash inputs of every leaf of a full-domain chunk (one point per leaf).

    ``conv`` holds the chunk's conversion inputs (``half_w`` blocks per leaf, the first one
    ``(s ^ 2, s_hi ^ epoch)`` with bit 0 cleared) and ``t_in`` the leaves' control bits, as
    :func:`~flwr_fsl.kernels.dpf_kernels.fd_leaves` reads them; the leaf block is rebuilt from
    them (so the proof does not depend on the U-DPF epoch). ``key_first[key]`` is the key's
    first global output point, so a leaf's point inside its key is ``tasks_i[k, 3] -
    key_first[key] + i``. ``tasks_i`` holds the chunk's tasks only.
    """
    pos = 0
    for k in range(tasks_i.shape[0]):
        key = tasks_i[k, 0]
        e = epochs[key]
        nl = min(1 << tasks_i[k, 2], tasks_i[k, 4] - tasks_i[k, 3])  # leaves kept (one point each)
        x = np.uint64(tasks_i[k, 3] - key_first[key])
        for leaf in range(pos, pos + nl):
            c = leaf * half_w
            lo_word = ((conv[c, 0] ^ TWO) & CLEAR) | np.uint64(t_in[leaf])
            hi_word = conv[c, 1] ^ e
            # The four blocks of H(x, blk), unrolled (as _write_inputs): lo ^ (q << 1), hi ^ a^q x.
            x1 = _dbl(x)
            x2 = _dbl(x1)
            r = BLOCKS * leaf
            out[r, 0] = lo_word
            out[r, 1] = hi_word ^ x
            out[r + 1, 0] = lo_word ^ TWO
            out[r + 1, 1] = hi_word ^ x1
            out[r + 2, 0] = lo_word ^ np.uint64(4)
            out[r + 2, 1] = hi_word ^ x2
            out[r + 3, 0] = lo_word ^ np.uint64(6)
            out[r + 3, 1] = hi_word ^ _dbl(x2)
            x += ONE
        pos += nl


@njit(cache=True, nogil=True)
def fd_proof_finish(
    enc: np.ndarray,
    inputs: np.ndarray,
    t_in: np.ndarray,
    tasks_i: np.ndarray,
    cw_proof: np.ndarray,
    proofs: np.ndarray,
) -> None:  # pragma: no cover - numba
    """``proofs[point] = H(x, blk) ^ t * cs`` for every leaf below its task's point limit.

    ``tasks_i`` holds the chunk's tasks only.
    """
    pos = 0
    for k in range(tasks_i.shape[0]):
        key = tasks_i[k, 0]
        nl = min(1 << tasks_i[k, 2], tasks_i[k, 4] - tasks_i[k, 3])  # leaves kept (one point each)
        shift = tasks_i[k, 3] - pos  # leaf -> its point
        # The key's correction words, held in registers for the task's leaves.
        c0, c1, c2, c3 = cw_proof[key, 0], cw_proof[key, 1], cw_proof[key, 2], cw_proof[key, 3]
        c4, c5, c6, c7 = cw_proof[key, 4], cw_proof[key, 5], cw_proof[key, 6], cw_proof[key, 7]
        for leaf in range(pos, pos + nl):
            m = ZERO - np.uint64(t_in[leaf])
            r = BLOCKS * leaf
            d = shift + leaf
            proofs[d, 0] = enc[r, 0] ^ inputs[r, 0] ^ (c0 & m)
            proofs[d, 1] = enc[r, 1] ^ inputs[r, 1] ^ (c1 & m)
            proofs[d, 2] = enc[r + 1, 0] ^ inputs[r + 1, 0] ^ (c2 & m)
            proofs[d, 3] = enc[r + 1, 1] ^ inputs[r + 1, 1] ^ (c3 & m)
            proofs[d, 4] = enc[r + 2, 0] ^ inputs[r + 2, 0] ^ (c4 & m)
            proofs[d, 5] = enc[r + 2, 1] ^ inputs[r + 2, 1] ^ (c5 & m)
            proofs[d, 6] = enc[r + 3, 0] ^ inputs[r + 3, 0] ^ (c6 & m)
            proofs[d, 7] = enc[r + 3, 1] ^ inputs[r + 3, 1] ^ (c7 & m)
        pos += nl


@intrinsic
def _proof_inputs(typingctx, lo_word, hi_word, x, out_p):  # type: ignore[no-untyped-def]
    """Write the four AES inputs of ``H(x, (lo_word, hi_word))`` (64 bytes) at ``out_p``.

    Block ``q`` is ``(lo_word ^ (q << 1), hi_word ^ alpha^q * x)`` (:func:`_write_inputs`),
    stored as one 128-bit vector; all arguments are ``uint64``.
    """
    sig = types.void(*([types.uint64] * 4))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        lo_word, hi_word, tweak, out_p = args
        i64 = ir.IntType(64)
        out = _v2_ptr(builder, out_p)
        base = _v2(builder, lo_word, hi_word)
        for q in range(BLOCKS):
            blk = builder.xor(base, _v2(builder, ir.Constant(i64, 2 * q), tweak))
            builder.store(blk, builder.gep(out, [ir.Constant(i64, q)]), align=8)
            # alpha * tweak in GF(2^64): shift left, reduce by x^4 + x^3 + x + 1
            top = builder.lshr(tweak, ir.Constant(i64, 63))
            red = builder.and_(ir.Constant(i64, 0x1B), builder.sub(ir.Constant(i64, 0), top))
            tweak = builder.xor(builder.shl(tweak, ir.Constant(i64, 1)), red)

    return sig, codegen


@intrinsic
def _proof_words(typingctx, enc_p, in_p, t, cws, out_p):  # type: ignore[no-untyped-def]
    """Write one leaf's proof ``H(x, blk) ^ t * cs`` (64 bytes) at ``out_p``: 128-bit operations.

    ``enc_p``/``in_p`` address the leaf's four proof-key ciphertexts and AES inputs, ``t`` is
    its control bit and ``cws`` its key's eight proof correction words (a tuple, held in
    registers across a task's leaves).
    """
    u64 = types.uint64
    sig = types.void(u64, u64, u64, types.UniTuple(u64, 2 * BLOCKS), u64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        enc_p, in_p, t, cws, out_p = args
        i64 = ir.IntType(64)
        m = builder.sub(ir.Constant(i64, 0), t)
        mask = _v2(builder, m, m)
        enc, inp = _v2_ptr(builder, enc_p), _v2_ptr(builder, in_p)
        outw = builder.inttoptr(out_p, i64.as_pointer())
        for q in range(BLOCKS):
            idx = [ir.Constant(i64, q)]
            h = builder.xor(
                builder.load(builder.gep(enc, idx), align=8),
                builder.load(builder.gep(inp, idx), align=8),
            )
            cw = _v2(
                builder, builder.extract_value(cws, 2 * q), builder.extract_value(cws, 2 * q + 1)
            )
            y = builder.xor(h, builder.and_(cw, mask))
            for w in range(2):  # 8-byte non-temporal stores, as dpf_vectors._leaf_words_nt
                word = builder.extract_element(y, ir.Constant(ir.IntType(32), w))
                _emit_store_nt(builder, builder.gep(outw, [ir.Constant(i64, 2 * q + w)]), word)

    return sig, codegen


@njit(cache=True, nogil=True)
def _advance(
    at: tuple[int, int, int], n: int, nl: int
) -> tuple[int, int, int]:  # pragma: no cover - numba
    """Move the cursor ``at`` (task, leaf in it, the task's first leaf) ``n`` leaves on.

    ``nl`` is the task's number of leaves; a cursor at its end moves to the next task.
    """
    k, i, pos = at
    if i + n >= nl:
        return k + 1, 0, pos + nl
    return k, i + n, pos


@njit(cache=True, nogil=True)
def _fill(
    leaves: tuple[np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray],
    half_w: int,
    at: tuple[int, int, int],
    sub: int,
    in_base: np.uint64,
) -> tuple[int, int, int, int]:  # pragma: no cover - numba
    """Write the proof inputs of up to ``sub`` leaves from ``at`` (task, leaf in it, first leaf).

    Returns the position after the last leaf written and the number written.
    """
    conv, t_in, tasks_i = leaves
    key_first, epochs, _ = key
    fill = 0
    while at[0] < tasks_i.shape[0] and fill < sub:
        k, i, pos = at
        j = tasks_i[k, 0]
        e = epochs[j]
        nl = min(1 << tasks_i[k, 2], tasks_i[k, 4] - tasks_i[k, 3])  # leaves kept (one point each)
        n = min(nl - i, sub - fill)
        x = np.uint64(tasks_i[k, 3] - key_first[j] + i)
        c = np.uint64((pos + i) * half_w)
        hw = np.uint64(half_w)
        leaf = np.uint64(pos + i)
        dst = in_base + np.uint64(BLOCKS * 16 * fill)
        for _ in range(n):  # unsigned indices: no negative-index wraparound selects
            lo_word = ((conv[c, 0] ^ TWO) & CLEAR) | np.uint64(t_in[leaf])
            _proof_inputs(lo_word, conv[c, 1] ^ e, x, dst)  # type: ignore[call-arg]
            x += ONE
            c += hw
            leaf += ONE
            dst += np.uint64(BLOCKS * 16)
        fill += n
        at = _advance(at, n, nl)
    return at[0], at[1], at[2], fill


@njit(cache=True, nogil=True)
def _finish(
    leaves: tuple[np.ndarray, np.ndarray, np.ndarray],
    cw_proof: np.ndarray,
    at: tuple[int, int, int],
    fill: int,
    bases: tuple[np.uint64, np.uint64, np.uint64],
) -> None:  # pragma: no cover - numba
    """Write the proofs of the ``fill`` leaves from ``at`` (as :func:`_fill` laid them out).

    ``bases`` are the addresses of the ciphertexts, the AES inputs and the proof rows.
    """
    _, t_in, tasks_i = leaves
    enc_base, in_base, out_base = bases
    done = 0
    while done < fill:
        k, i, pos = at
        j = tasks_i[k, 0]
        nl = min(1 << tasks_i[k, 2], tasks_i[k, 4] - tasks_i[k, 3])  # leaves kept (one point each)
        n = min(nl - i, fill - done)
        c = cw_proof[j]
        cws = (c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7])  # the key's words, in registers
        off = np.uint64(BLOCKS * 16 * done)
        dst = out_base + np.uint64(BLOCKS * 16 * (tasks_i[k, 3] + i))
        leaf = np.uint64(pos + i)
        for _ in range(n):
            _proof_words(enc_base + off, in_base + off, np.uint64(t_in[leaf]), cws, dst)  # type: ignore[call-arg]
            off += np.uint64(BLOCKS * 16)
            dst += np.uint64(BLOCKS * 16)
            leaf += ONE
        done += n
        at = _advance(at, n, nl)


@njit(cache=True, nogil=True)
def proof_pass(
    fn: int,
    ctx: int,
    leaves: tuple[np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray],
    half_w: int,
    bufs: tuple[np.ndarray, np.ndarray],
    proofs: np.ndarray,
) -> int:  # pragma: no cover - numba
    """Every leaf proof of a chunk, in batches of ``sub`` leaves.

    The same words as :func:`fd_proof_inputs`, one AES call and :func:`fd_proof_finish` over
    the whole chunk, per batch: :func:`_fill` writes the batch's AES inputs, OpenSSL encrypts
    them, :func:`_finish` walks the same leaves again and writes their proofs (with
    non-temporal stores, :func:`_proof_words`; an ``sfence`` ends the pass).

    ``leaves`` is ``(conv, t_in, tasks_i)`` as ``fd_proof_inputs`` reads them (the chunk's
    tasks only), ``key`` is ``(key_first, epochs, cw_proof)``, ``bufs`` the ``(BLOCKS * sub,
    2)`` inputs and ``(BLOCKS * sub + 1, 2)`` ciphertexts of a batch (``sub``:
    :data:`flwr_fsl.kernels.vdpf_eval.SUB_LEAVES` by default). Returns the number of AES
    calls, or ``-1`` if OpenSSL failed.
    """
    p_in, p_enc = bufs
    sub = p_in.shape[0] // BLOCKS
    in_base = np.uint64(p_in.ctypes.data)
    bases = (np.uint64(p_enc.ctypes.data), in_base, np.uint64(proofs.ctypes.data))
    outl = np.zeros(1, dtype=np.int32)
    calls = 0
    at = (0, 0, 0)
    while True:
        k, i, pos, fill = _fill(leaves, key, half_w, at, sub, in_base)
        if fill == 0:
            store_fence()  # the proofs' non-temporal stores, before any reader
            return calls
        if not native_encrypt(fn, ctx, p_in, p_enc, BLOCKS * fill, outl):
            store_fence()
            return -1
        _finish(leaves, key[2], at, fill, bases)
        calls += 1
        at = (k, i, pos)


@njit(cache=True, nogil=True)
def scatter_bins(
    share: np.ndarray,
    bin_items: np.ndarray,
    bin_offsets: np.ndarray,
    values: np.ndarray,
    sign: int,
) -> None:  # pragma: no cover - numba
    """``share[item] += sign * values[point]`` for every bin's real points, skipping dummy slots.

    Bin ``b``'s items are ``bin_items[bin_offsets[b]:bin_offsets[b + 1]]`` and its evaluated
    points (in ``values``) are those ranks followed by its dummy slot, so bin ``b``'s first
    point is row ``bin_offsets[b] + b``. Only the first ``share.shape[1]`` words of a point
    are added (a padding word, if any, is dropped). ``sign`` is 1 or -1.
    """
    tau = share.shape[1]
    neg = sign < 0
    for b in range(bin_offsets.shape[0] - 1):
        start = bin_offsets[b]
        for j in range(bin_offsets[b + 1] - start):
            row = bin_items[start + j]
            p = start + b + j
            for t in range(tau):
                v = values[p, t]
                if neg:
                    v = ZERO - v
                share[row, t] += v
