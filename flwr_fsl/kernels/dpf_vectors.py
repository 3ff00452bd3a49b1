"""LLVM intrinsics of the DPF's per-node arithmetic: 128-bit and 512-bit vectors, ``movnti``.

The full-domain passes of :mod:`flwr_fsl.kernels.dpf_kernels` (both children of a parent, a
leaf's conversion block, a leaf's output words) run through these small intrinsics: LLVM left
numba's scalar form of the same words unvectorized. The ``4`` forms take four consecutive
nodes of one task and level on ``<8 x i64>`` vectors (one AVX-512 instruction per step where
the CPU has it; elsewhere LLVM splits the vectors and the words stay the same): in a 100k-key
depth-9 evaluation the last tree level's pass went from 14.4 to 6.2 ms and the leaf conversion
with its output from 23.1 to 16.3 ms (session 37, an AVX-512 EPYC, load 7-8). Non-temporal
8-byte stores (``movnti``) write outputs no cache would keep; :func:`_sfence` orders them.

:func:`_flat_level` runs one tree level of a chunk of whole tasks of one height (the common
full-domain batch) through them as one flat loop; :func:`_leaf_line_nt` writes four leaves'
output words as one aligned cache line.

Layouts as in :mod:`flwr_fsl.kernels.dpf_kernels`: a block is two ``uint64`` words, a node's
control bit rides in bit 0 of word 0. Every intrinsic takes addresses (``uint64``), so a hot
loop passes no array (no refcount updates per node).
"""

from __future__ import annotations

import platform
import sys

import numpy as np
from llvmlite import binding, ir
from numba import njit, types
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_X86_64 = platform.machine().lower() in ("x86_64", "amd64")
if _X86_64:
    binding.initialize_native_asmparser()  # _store_nt's inline ``movnti``


@intrinsic
def _store_nt(typingctx, arr, idx, val):  # type: ignore[no-untyped-def]
    """``arr[idx] = val`` as a non-temporal store (no read of the line; it bypasses the caches).

    A large output written once (hundreds of MB) costs half the memory traffic this way;
    :func:`~flwr_fsl.kernels.dpf_kernels.store_fence` must follow before another thread reads it.
    """
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"):
        return None  # only a flat C-contiguous array: the store addresses data + 8 * idx
    if arr.dtype != types.uint64:
        return None
    sig = types.void(arr, types.uint64, types.uint64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        _emit_store_nt(builder, builder.gep(ary.data, [args[1]]), args[2])

    return sig, codegen


def _emit_store_nt(builder, ptr, val):  # type: ignore[no-untyped-def]
    """Emit ``*ptr = val`` (one 64-bit word) as a non-temporal store."""
    if _X86_64:
        # ``movnti`` itself: LLVM's SLP vectorizer merged two adjacent stores marked
        # non-temporal into one unaligned vector store, which x86 then emits as a plain
        # store (no ``movnti`` was left in fd_leaves, and ``nt`` had no effect).
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, val.type])
        builder.asm(fnty, "movntiq $1, ($0)", "r,r,~{memory}", [ptr, val], True)
        return
    st = builder.store(val, ptr)
    st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


@intrinsic
def _sfence(typingctx):  # type: ignore[no-untyped-def]
    """Order every earlier non-temporal store before later stores (x86 ``sfence``)."""
    sig = types.void()

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        if _X86:
            fn = builder.module.declare_intrinsic(
                "llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), [])
            )
            builder.call(fn, [])
        else:
            builder.fence("seq_cst")

    return sig, codegen


@intrinsic
def _load_u8(typingctx, addr):  # type: ignore[no-untyped-def]
    """Load the byte at address ``addr``, zero-extended to ``uint64`` (a leaf's control bit)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        byte = builder.load(builder.inttoptr(args[0], ir.IntType(8).as_pointer()), align=1)
        return builder.zext(byte, ir.IntType(64))

    return sig, codegen


def _v2(builder, lo, hi):  # type: ignore[no-untyped-def]
    """Build the ``<2 x i64>`` vector ``(lo, hi)``."""
    vec = ir.Constant(ir.VectorType(ir.IntType(64), 2), None)
    vec = builder.insert_element(vec, lo, ir.Constant(ir.IntType(32), 0))
    return builder.insert_element(vec, hi, ir.Constant(ir.IntType(32), 1))


def _v2_ptr(builder, addr):  # type: ignore[no-untyped-def]
    """``addr`` (a ``uint64``) as a pointer to one 16-byte block."""
    return builder.inttoptr(addr, ir.VectorType(ir.IntType(64), 2).as_pointer())


def _mmo_children_ir(builder, args):  # type: ignore[no-untyped-def]
    """Both corrected children of one parent block as two ``<2 x i64>`` vectors.

    ``args`` are the addresses of the parent block and its left and right ciphertexts, then
    ``cl0, cr0, scw1`` (the corrections, control-bit correction in bit 0). The parent's bit 0
    selects the correction: ``child_c = enc_c ^ s ^ (cw_c & -(s & 1))``.
    """
    s_p, l_p, r_p, cl0, cr0, scw1 = args[:6]
    s = builder.load(_v2_ptr(builder, s_p), align=8)
    left = builder.load(_v2_ptr(builder, l_p), align=8)
    right = builder.load(_v2_ptr(builder, r_p), align=8)
    i32 = ir.IntType(32)
    s0 = builder.extract_element(s, ir.Constant(i32, 0))
    m = builder.sub(ir.Constant(s0.type, 0), builder.and_(s0, ir.Constant(s0.type, 1)))
    mask = _v2(builder, m, m)
    c_l = builder.xor(builder.xor(left, s), builder.and_(_v2(builder, cl0, scw1), mask))
    c_r = builder.xor(builder.xor(right, s), builder.and_(_v2(builder, cr0, scw1), mask))
    return c_l, c_r


@intrinsic
def _mmo_children(typingctx, s_p, l_p, r_p, cl0, cr0, scw1, out_p):  # type: ignore[no-untyped-def]
    """Write one parent's corrected children (32 bytes) at ``out_p``: 128-bit operations.

    All arguments are ``uint64`` (addresses and correction words; see :func:`_mmo_children_ir`).
    numba's scalar code for the same words was not vectorized by LLVM (four 8-byte loads,
    stores and masks per child).
    """
    sig = types.void(*([types.uint64] * 7))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        c_l, c_r = _mmo_children_ir(builder, args)
        out = _v2_ptr(builder, args[6])
        builder.store(c_l, out, align=8)
        builder.store(c_r, builder.gep(out, [ir.Constant(ir.IntType(64), 1)]), align=8)

    return sig, codegen


def _v8_ptr(builder, addr):  # type: ignore[no-untyped-def]
    """``addr`` (a ``uint64``) as a pointer to four 16-byte blocks (one ``<8 x i64>``)."""
    return builder.inttoptr(addr, ir.VectorType(ir.IntType(64), 8).as_pointer())


def _mmo_children4_ir(builder, args):  # type: ignore[no-untyped-def]
    """:func:`_mmo_children_ir` of four consecutive parents: their eight children in order.

    Returns two ``<8 x i64>`` vectors, ``(L0, R0, L1, R1)`` and ``(L2, R2, L3, R3)`` (each
    child two words); ``args`` as in :func:`_mmo_children_ir` (one task and level: the four
    parents share their corrections).
    """
    s_p, l_p, r_p, cl0, cr0, scw1 = args[:6]
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v8 = ir.VectorType(i64, 8)
    s = builder.load(_v8_ptr(builder, s_p), align=8)
    left = builder.load(_v8_ptr(builder, l_p), align=8)
    right = builder.load(_v8_ptr(builder, r_p), align=8)
    # Each parent's bit 0 in both of its words, then -bit: the mask of its correction.
    bit = builder.and_(s, ir.Constant(v8, [1, 0] * 4))
    idx = ir.Constant(ir.VectorType(i32, 8), [0, 0, 2, 2, 4, 4, 6, 6])
    mask = builder.sub(ir.Constant(v8, [0] * 8), builder.shuffle_vector(bit, bit, idx))

    def pairs(lo, hi):  # type: ignore[no-untyped-def]
        vec = ir.Constant(v8, None)
        for k in range(8):
            vec = builder.insert_element(vec, hi if k & 1 else lo, ir.Constant(i32, k))
        return vec

    c_l = builder.xor(builder.xor(left, s), builder.and_(pairs(cl0, scw1), mask))
    c_r = builder.xor(builder.xor(right, s), builder.and_(pairs(cr0, scw1), mask))
    kids = []
    for b in (0, 4):
        order = [b, b + 1, b + 8, b + 9, b + 2, b + 3, b + 10, b + 11]
        kids.append(builder.shuffle_vector(c_l, c_r, ir.Constant(ir.VectorType(i32, 8), order)))
    return kids[0], kids[1]


@intrinsic
def _mmo_children4(typingctx, s_p, l_p, r_p, cl0, cr0, scw1, out_p):  # type: ignore[no-untyped-def]
    """:func:`_mmo_children` of four consecutive parents at once: 512-bit operations.

    Same arguments (the first parent's addresses; the four share their corrections); the
    eight children (128 bytes) go to ``out_p`` in :func:`_mmo_children`'s order. With AVX-512
    the loads, masks and stores are one instruction for four parents; elsewhere LLVM splits
    the vectors and the words stay the same.
    """
    sig = types.void(*([types.uint64] * 7))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        out = _v8_ptr(builder, args[6])
        for half, kids in enumerate(_mmo_children4_ir(builder, args)):
            builder.store(kids, builder.gep(out, [ir.Constant(ir.IntType(64), half)]), align=8)

    return sig, codegen


@intrinsic
def _mmo_leaf_children4(typingctx, s_p, l_p, r_p, corrections, e, out_p, t_p):  # type: ignore[no-untyped-def]
    """:func:`_mmo_leaf_children` of four consecutive parents: 512-bit operations.

    Same arguments; eight conversion blocks go to ``out_p`` and the eight control bits to the
    bytes ``t_p .. t_p + 7`` (one 8-byte store).
    """
    u64 = types.uint64
    sig = types.void(u64, u64, u64, types.UniTuple(u64, 3), u64, u64, u64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        cws = [builder.extract_value(args[3], k) for k in range(3)]
        i32, i64 = ir.IntType(32), ir.IntType(64)
        v8 = ir.VectorType(i64, 8)
        kids = _mmo_children4_ir(builder, [*args[:3], *cws])
        keep = ir.Constant(v8, [0xFFFFFFFFFFFFFFFE, -1] * 4)
        flip = ir.Constant(v8, None)
        for k in range(8):
            val = args[4] if k & 1 else ir.Constant(i64, 2)
            flip = builder.insert_element(flip, val, ir.Constant(i32, k))
        out = _v8_ptr(builder, args[5])
        for half, child in enumerate(kids):
            conv = builder.xor(builder.and_(child, keep), flip)
            builder.store(conv, builder.gep(out, [ir.Constant(i64, half)]), align=8)
        # Word 0 of each child in child order, bit 0 of each as a byte (little- or big-endian
        # alike: the bytes are stored as a vector, in element order).
        firsts = ir.Constant(ir.VectorType(i32, 8), [0, 2, 4, 6, 8, 10, 12, 14])
        bits = builder.and_(builder.shuffle_vector(*kids, firsts), ir.Constant(v8, [1] * 8))
        i8x8 = ir.VectorType(ir.IntType(8), 8)
        builder.store(
            builder.trunc(bits, i8x8), builder.inttoptr(args[6], i8x8.as_pointer()), align=1
        )

    return sig, codegen


@intrinsic
def _mmo_leaf_children(typingctx, s_p, l_p, r_p, corrections, e, out_p, t_p):  # type: ignore[no-untyped-def]
    """Like :func:`_mmo_children`, the children as conversion blocks and control bits.

    Child ``c``'s block becomes ``(child_0 & ~1 ^ 2, child_1 ^ e)`` at ``out_p + 16 c`` (one
    conversion block per leaf, ``half_w == 1``) and its bit 0 the byte at ``t_p + c`` (both
    bytes in one 16-bit store). ``corrections`` is the tuple ``(cl0, cr0, scw1)`` of
    :func:`_mmo_children`.
    """
    u64 = types.uint64
    sig = types.void(u64, u64, u64, types.UniTuple(u64, 3), u64, u64, u64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        cws = [builder.extract_value(args[3], k) for k in range(3)]
        args = [*args[:3], *cws, *args[4:]]  # _mmo_children's order
        c_l, c_r = _mmo_children_ir(builder, args)
        i64 = ir.IntType(64)
        keep = _v2(builder, ir.Constant(i64, 0xFFFFFFFFFFFFFFFE), ir.Constant(i64, -1))
        flip = _v2(builder, ir.Constant(i64, 2), args[6])
        out = _v2_ptr(builder, args[7])
        bits = []
        for c, child in enumerate((c_l, c_r)):
            conv = builder.xor(builder.and_(child, keep), flip)
            builder.store(conv, builder.gep(out, [ir.Constant(i64, c)]), align=8)
            bits.append(builder.extract_element(child, ir.Constant(ir.IntType(32), 0)))
        one = ir.Constant(i64, 1)
        lo, hi = (bits[0], bits[1]) if sys.byteorder == "little" else (bits[1], bits[0])
        both = builder.or_(
            builder.and_(lo, one), builder.shl(builder.and_(hi, one), ir.Constant(i64, 8))
        )
        i16 = ir.IntType(16)
        builder.store(
            builder.trunc(both, i16), builder.inttoptr(args[8], i16.as_pointer()), align=1
        )

    return sig, codegen


@njit(cache=True, nogil=True)
def _flat_level(
    cws: np.ndarray, bases: tuple[int, int, int, int, int], total: int, shift: int, last: bool
) -> None:  # pragma: no cover - numba
    """One level of a chunk of whole tasks of one height: one flat loop over its parents.

    Task ``k`` of the chunk has parents ``k << shift .. (k + 1) << shift`` of the ``total``
    and the corrections ``cws[k] = (cl0, cr0, scw1, epoch)``; ``bases`` are the addresses of
    the level's blocks, its left and right ciphertexts, the next level and (``last``) the
    control bits. The words of the per-task loop of
    :func:`~flwr_fsl.kernels.dpf_kernels.fd_levels`, without its per-task trip counts, branches
    and dependent loads between runs of parents: the level passes alone of a 100k-key depth-9
    evaluation went from 19.4 to 17.9 ms, of depths 4..9 from 21.2 to 14.5 ms (session 38,
    dpf_bench --breakdown, load 0.8-4).
    """
    two, eight, sixteen = np.uint64(2), np.uint64(8), np.uint64(16)
    s_base, l_base, r_base, o_base, t_base = bases
    if shift >= 2:  # four parents per step, never two tasks in one step
        steps = 1 << (shift - 2)
        for k in range(total >> shift):  # a task's corrections stay in registers
            cl0, cr0, scw1, e = cws[k, 0], cws[k, 1], cws[k, 2], cws[k, 3]
            for j in range(steps):
                ug = np.uint64(k * steps + j)
                off = np.uint64(64) * ug
                if last:
                    _mmo_leaf_children4(
                        s_base + off, l_base + off, r_base + off, (cl0, cr0, scw1), e,
                        o_base + two * off, t_base + eight * ug,
                    )  # type: ignore[call-arg]  # fmt: skip
                else:
                    _mmo_children4(
                        s_base + off, l_base + off, r_base + off, cl0, cr0, scw1,
                        o_base + two * off,
                    )  # type: ignore[call-arg]  # fmt: skip
        return
    for p in range(total):
        k = p >> shift
        cl0, cr0, scw1, e = cws[k, 0], cws[k, 1], cws[k, 2], cws[k, 3]
        up = np.uint64(p)
        off = sixteen * up
        if last:
            _mmo_leaf_children(
                s_base + off, l_base + off, r_base + off, (cl0, cr0, scw1), e,
                o_base + two * off, t_base + two * up,
            )  # type: ignore[call-arg]  # fmt: skip
        else:
            _mmo_children(
                s_base + off, l_base + off, r_base + off, cl0, cr0, scw1, o_base + two * off
            )  # type: ignore[call-arg]


@intrinsic
def _leaf_words_nt(typingctx, enc_p, blk_p, t, c0, c1, sgn, out_p):  # type: ignore[no-untyped-def]
    """One leaf's two output words ``(H(s) + t * CW_leaf) ^ sgn - sgn`` with two ``movnti``.

    ``enc_p``/``blk_p`` address the leaf's value-key ciphertext and conversion block, ``t`` is
    its control bit, ``(c0, c1)`` its key's leaf correction and ``sgn`` ``0`` or ``~0`` (party
    1 negates); the words go to ``out_p`` and ``out_p + 8``. The arithmetic runs on one
    128-bit vector, the stores stay 8-byte non-temporal (see :func:`_store_nt`).
    """
    sig = types.void(*([types.uint64] * 7))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        enc_p, blk_p, t, c0, c1, sgn, out_p = args
        i64 = ir.IntType(64)
        h = builder.xor(
            builder.load(_v2_ptr(builder, enc_p), align=8),
            builder.load(_v2_ptr(builder, blk_p), align=8),
        )
        m = builder.sub(ir.Constant(i64, 0), t)
        y = builder.add(h, builder.and_(_v2(builder, c0, c1), _v2(builder, m, m)))
        sv = _v2(builder, sgn, sgn)
        y = builder.sub(builder.xor(y, sv), sv)
        ptr = builder.inttoptr(out_p, i64.as_pointer())
        for w in range(2):
            word = builder.extract_element(y, ir.Constant(ir.IntType(32), w))
            _emit_store_nt(builder, builder.gep(ptr, [ir.Constant(i64, w)]), word)

    return sig, codegen


def _leaf_words4_ir(builder, args):  # type: ignore[no-untyped-def]
    """Return the eight output words of four consecutive leaves as one ``<8 x i64>`` vector.

    ``args`` are those of :func:`_leaf_words_nt4` but the output address.
    """
    enc_p, blk_p, t_p, c0, c1, sgn = args[:6]
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v8 = ir.VectorType(i64, 8)
    h = builder.xor(
        builder.load(_v8_ptr(builder, enc_p), align=8),
        builder.load(_v8_ptr(builder, blk_p), align=8),
    )
    i8x4 = ir.VectorType(ir.IntType(8), 4)
    t4 = builder.zext(
        builder.load(builder.inttoptr(t_p, i8x4.as_pointer()), align=1),
        ir.VectorType(i64, 4),
    )
    idx = ir.Constant(ir.VectorType(i32, 8), [0, 0, 1, 1, 2, 2, 3, 3])
    m = builder.sub(ir.Constant(v8, [0] * 8), builder.shuffle_vector(t4, t4, idx))
    cw = ir.Constant(v8, None)
    sv = ir.Constant(v8, None)
    for k in range(8):
        cw = builder.insert_element(cw, c1 if k & 1 else c0, ir.Constant(i32, k))
        sv = builder.insert_element(sv, sgn, ir.Constant(i32, k))
    y = builder.add(h, builder.and_(cw, m))
    return builder.sub(builder.xor(y, sv), sv)


@intrinsic
def _leaf_words_nt4(typingctx, enc_p, blk_p, t_p, c0, c1, sgn, out_p):  # type: ignore[no-untyped-def]
    """:func:`_leaf_words_nt` of four consecutive leaves: 512-bit arithmetic, eight ``movnti``.

    Same arguments but ``t_p``, the address of the four leaves' control-bit bytes; the
    eight words go to ``out_p .. out_p + 56``.
    """
    sig = types.void(*([types.uint64] * 7))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32, i64 = ir.IntType(32), ir.IntType(64)
        y = _leaf_words4_ir(builder, args)
        ptr = builder.inttoptr(args[6], i64.as_pointer())
        for w in range(8):
            word = builder.extract_element(y, ir.Constant(i32, w))
            _emit_store_nt(builder, builder.gep(ptr, [ir.Constant(i64, w)]), word)

    return sig, codegen


@intrinsic
def _leaf_line_nt(typingctx, enc_p, blk_p, t_p, c0, c1, sgn, out_p):  # type: ignore[no-untyped-def]
    """:func:`_leaf_words_nt4` into one whole cache line: ``out_p`` must be 64-byte aligned.

    One aligned 64-byte non-temporal vector store (``vmovntdq``; two or four narrower ones
    without AVX-512) instead of eight ``movnti``: writing a 410 MB output this way took 9.4
    instead of 12.1 ms (session 38, the AVX-512 EPYC). The alignment is the caller's to keep:
    an unaligned vector store would lose the non-temporal hint (see :func:`_emit_store_nt`).
    """
    sig = types.void(*([types.uint64] * 7))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        y = _leaf_words4_ir(builder, args)
        st = builder.store(y, _v8_ptr(builder, args[6]), align=64)
        st.set_metadata(
            "nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        )

    return sig, codegen
