"""Numba loops of the DPF (BGI16 tree): everything between two batched AES calls.

The driver in :mod:`flwr_fsl.crypto.dpf` keeps the seeds of a whole tree level of many keys in
one buffer, encrypts it with two batched :class:`~flwr_fsl.kernels.aes.BatchedAES` calls (one
per fixed key: left and right child) and hands seeds and ciphertexts to a kernel here. A kernel
finishes the Matyas–Meyer–Oseas feed-forward (``child = AES_{K_c}(x) ^ x``), applies the
correction word where the parent's control bit is set, and writes the *next* level's blocks
directly (fused; no separate pass).

Block and seed layout: ``uint64`` arrays of shape ``(n, 2)`` (word 0 = bytes 0..7). A node's
block is its seed with its control bit in bit 0 (``x = s | t``), and the tree PRG's input is the
whole block, so a tree level's AES input is the blocks themselves (no per-child copies, no
clearing). The full-domain kernels therefore carry no control-bit arrays between levels: the
correction is ``(cw_seed | tcw_c, cw_seed_hi)`` masked by the parent's bit 0, and the
corrected child block is the next input as it stands. A leaf seed (bit 0 clear) converts to
``W`` output words through the value key with inputs ``s ^ (2 + q, epoch)`` for ``q < W / 2``.
A correction word is a seed ``cw_seeds[i]`` (bit 0 always 0) plus ``cw_bits[i]`` (bit 0:
left control-bit correction, bit 1: right).

The per-node arithmetic of the full-domain passes (both children of a parent, a leaf's
conversion block, a leaf's output words) runs through the 128-bit and 512-bit LLVM intrinsics
of :mod:`flwr_fsl.kernels.dpf_vectors` (runs of four nodes on the 512-bit forms).

Everything is ``uint64``/``uint8``/``int64`` with explicit casts (a Python int mixed with uint64
would promote to float64 in numba); every kernel is ``cache=True`` and writes into buffers the
caller allocated once and reuses.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flwr_fsl.kernels.aes import log_blocks, native_encrypt
from flwr_fsl.kernels.dpf_vectors import (
    _flat_level,
    _leaf_line_nt,
    _leaf_words_nt,
    _leaf_words_nt4,
    _mmo_children,
    _mmo_children4,
    _mmo_leaf_children,
    _mmo_leaf_children4,
    _sfence,
    _store_nt,
)

ZERO = np.uint64(0)
ONE = np.uint64(1)
TWO = np.uint64(2)
THREE = np.uint64(3)
FOUR = np.uint64(4)
FIVE = np.uint64(5)
SIX = np.uint64(6)
SEVEN = np.uint64(7)
EIGHT = np.uint64(8)
SIXTEEN = np.uint64(16)
CLEAR = ~np.uint64(1)
LOW4 = np.uint64(15)
LOW6 = np.uint64(63)


@njit(cache=True, nogil=True)
def store_fence() -> None:  # pragma: no cover - numba
    """Make the non-temporal stores of :func:`fd_leaves` (``nt=True``) visible to other threads."""
    _sfence()  # type: ignore[call-arg]


@njit(cache=True, nogil=True)
def chunk_bounds(cost: np.ndarray, budget: int) -> np.ndarray:  # pragma: no cover - numba
    """Greedy split of consecutive items into chunks whose summed ``cost`` stays near ``budget``.

    Returns the ``(n_chunks + 1,)`` int64 boundaries; every chunk holds at least one item.
    """
    n = cost.shape[0]
    bounds = np.empty(n + 1, dtype=np.int64)
    bounds[0] = 0
    nb = 1
    acc = 0
    for i in range(n):
        c = cost[i]
        if acc > 0 and acc + c > budget:
            bounds[nb] = i
            nb += 1
            acc = 0
        acc += c
    if n > 0:
        bounds[nb] = n
        nb += 1
    return bounds[:nb]


# --------------------------------------------------------------------------------------------
# Both parties' paths (U-DPF hints, flwr_fsl.crypto.udpf). Gen's own kernels are in
# flwr_fsl.kernels.dpf_gen_kernels.
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def gen_init(
    order: np.ndarray,
    lo: int,
    n: int,
    root0: np.ndarray,
    root1: np.ndarray,
    state_t: np.ndarray,
    seeds: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Load root seeds of keys ``order[lo:lo+n]`` (party ``b`` at row ``2 * i + b``)."""
    for i in range(n):
        j = order[lo + i]
        for w in range(2):
            seeds[2 * i, w] = root0[j, w]
            seeds[2 * i + 1, w] = root1[j, w]
        # The control bit lives in bit 0 of the block (root seeds have it clear): t0 = 0, t1 = 1.
        seeds[2 * i, 0] &= CLEAR
        seeds[2 * i + 1, 0] = (seeds[2 * i + 1, 0] & CLEAR) | ONE
        state_t[i, 0] = 0
        state_t[i, 1] = 1


@njit(cache=True, nogil=True)
def leaf_blocks_pair(
    n: int,
    seeds: np.ndarray,
    epoch: np.ndarray,
    order: np.ndarray,
    lo: int,
    half_w: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Conversion inputs ``s_b ^ (2 + q, epoch)`` of both parties' leaf seeds (party-major).

    ``seeds[2 * i + b]`` is party ``b``'s leaf seed of key ``order[lo + i]``.
    """
    for i in range(n):
        e = epoch[order[lo + i]]
        for b in range(2):
            base = (2 * i + b) * half_w
            for q in range(half_w):
                out[base + q, 0] = (seeds[2 * i + b, 0] & CLEAR) ^ (TWO + np.uint64(q))
                out[base + q, 1] = seeds[2 * i + b, 1] ^ e


# --------------------------------------------------------------------------------------------
# Full-domain evaluation: tasks = (key, subtree root) processed leaf-aligned in chunks.
# tasks_i columns: 0 key, 1 level of the task root in the key's tree, 2 height h,
# 3 first output point (global), 4 output point limit (global, exclusive).
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def needed_leaves(h: int, first: int, limit: int, group: int) -> int:  # pragma: no cover - numba
    """Leaves of a height-``h`` task holding a point in ``[first, limit)`` (``group`` a leaf)."""
    return min(1 << h, (limit - first + group - 1) >> (group - 1))  # group is 1 or 2


@njit(cache=True, nogil=True)
def level_count(
    tasks_i: np.ndarray, lo: int, hi: int, level: int, max_h: int, group: int
) -> int:  # pragma: no cover - numba
    """Nodes :func:`fd_levels` writes at ``level + 1`` (its pass switched off: a profiling run)."""
    n = 0
    for k in range(lo, hi):
        h = tasks_i[k, 2]
        start = max_h - h
        if start > level + 1:
            break
        if start == level + 1:
            n += 1
            continue
        sh = h - (level - start)
        lv = needed_leaves(h, tasks_i[k, 3], tasks_i[k, 4], group)
        n += (lv + (1 << (sh - 1)) - 1) >> (sh - 1)
    return n


@njit(cache=True, nogil=True)
def fd_levels(  # noqa: C901, PLR0915
    aes: tuple[int, np.ndarray, np.ndarray, np.ndarray, int, int],
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
    chunk: tuple[int, int, int, int, int, int],
    tasks: tuple[np.ndarray, np.ndarray],
    pub: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    half_w: int,
    group: int,
) -> tuple[int, int]:  # pragma: no cover - numba
    """Expand chunk levels ``first .. stop - 1`` (``first = -1``: load the roots first).

    ``chunk`` is ``(lo, hi, first, stop, max_h, n)`` (``n``: the nodes at depth ``first``),
    ``tasks`` ``(tasks_i, task_seed)`` and ``pub`` the batch's ``(level_off, cw_seeds, cw_bits,
    epochs)``. ``scratch`` is ``(bufs, tbufs, cwt)``: ``bufs`` ``(4, cap + 1, 2)`` (the nodes
    at depth ``d`` in ``bufs[d & 1]``, the left- and right-key encryptions of a level's blocks
    in ``bufs[2]`` and ``bufs[3]``), ``tbufs`` ``(2, cap)`` likewise for the leaves' control
    bits, ``cwt`` ``(rows, 4)`` for the corrections of :func:`_flat_level`: the flat passes
    need ``rows >= (hi - lo) * (stop - max(first, 0))`` (one row per task and level), else
    the per-task passes run.
    ``aes`` is ``(fn, ctxs, outl, log, n_log, parts)``: with ``fn != 0`` each level first runs
    its two AES calls through OpenSSL (``ctxs[0]``, ``ctxs[1]``;
    :func:`~flwr_fsl.kernels.aes.native_encrypt`, block counts logged), else the caller has
    written ``bufs[2]``/``bufs[3]`` (one level per call). ``parts`` as in
    :func:`~flwr_fsl.kernels.dpf_eval.fd_core` (``1`` the AES calls, ``2`` the passes).
    Returns ``(n, n_log)``: the node count at depth ``stop`` (leaves at the last level) and the
    updated call count, ``-1`` if OpenSSL failed. One call runs a chunk's whole tree: a call
    with this many array arguments cost about 170 ns in a probe (numba's reference counts;
    session 38), paid once per level before.

    A level's pass: ``bufs[2]``/``bufs[3]`` hold the encryptions of the level's blocks
    (control bit in bit 0; ``task_seed`` rows are blocks too). Only the last level writes
    control bits (for :func:`fd_leaves`) and clears bit 0 of the conversion inputs.
    Tasks ``lo..hi-1`` are sorted by height, descending; a task of height ``h`` joins at level
    ``max_h - h`` so that all of them reach their leaves together. Children of active nodes are
    written in order, then the roots of tasks joining at ``level + 1``. At the last level the
    output holds conversion blocks (``half_w`` per leaf) instead of seeds.

    Subtree skipping: a task keeps only the nodes whose subtree holds a point below its limit
    (:func:`needed_leaves` leaves; ``ceil(L / 2**(h - d))`` nodes at depth ``d``), so a bin
    padded to a power of two costs AES blocks for its real points only. A pair whose right
    child is not needed is still written whole: the next task's nodes (written later, at the
    same position) overwrite the spare child, so the buffers need one node (at the last level
    ``half_w`` blocks) of room past the count returned.
    """
    fn, ctxs, outl, log, n_log, parts = aes
    bufs, tbufs, cwt = scratch
    lo, hi, first, stop, max_h, n0 = chunk
    tasks_i, task_seed = tasks
    level_off, cw_seeds, cw_bits, epochs = pub
    flat = bufs.reshape(-1)  # the generic paths index words: no array view per level
    tflat = tbufs.reshape(-1)
    stride = 2 * bufs.shape[1]  # words per buffer
    t_stride = tbufs.shape[1]
    enc_l = bufs[2]
    enc_r = bufs[3]
    # Addresses for the per-parent intrinsics (:func:`_mmo_children`).
    b_addr = np.uint64(bufs.ctypes.data)
    tb_addr = np.uint64(tbufs.ctypes.data)
    l_w = 2 * stride
    r_w = 3 * stride
    l_base = b_addr + np.uint64(8 * l_w)
    r_base = b_addr + np.uint64(8 * r_w)
    ul_w, ur_w = np.uint64(l_w), np.uint64(r_w)
    n = n0
    # Whole tasks of one height (a full-domain batch of equal depths): flat level passes.
    flat_ok = half_w == 1 or stop < max_h
    for k in range(lo, hi):
        h = tasks_i[k, 2]
        lv = needed_leaves(h, tasks_i[k, 3], tasks_i[k, 4], group)
        if h != max_h or lv != 1 << h:
            flat_ok = False
            break
    nk = hi - lo
    l0 = max(first, 0)
    if flat_ok and nk * (stop - l0) > cwt.shape[0]:
        flat_ok = False  # no room for the table below: the per-task passes (the same words)
    if flat_ok and parts & 2:  # (no passes, no table: the benchmark's AES-alone timing)
        # The corrections of every level at once, task by task: a key's levels are consecutive
        # rows of ``cw_seeds`` (one pass over them, its tasks' rows and epochs loaded once).
        # Filled level by level before: 100k keys of depth 9 took 116.2-121.3 ms, now
        # 116.3-120.4; of depths 4..9 49.6-51.9, now 46.4-50.1 (eight interleaved runs of each;
        # session 38, load 0.7-1.2).
        for k in range(lo, hi):
            key = tasks_i[k, 0]
            base = level_off[key] + tasks_i[k, 1]
            e = epochs[key]
            for level in range(l0, stop):
                idx = base + level
                row = (level - l0) * nk + (k - lo)
                bits = np.uint64(cw_bits[idx])
                s0 = cw_seeds[idx, 0]
                cwt[row, 0] = s0 | (bits & ONE)
                cwt[row, 1] = s0 | ((bits >> ONE) & ONE)
                cwt[row, 2] = cw_seeds[idx, 1]
                cwt[row, 3] = e
    for level in range(first, stop):
        s_w = (level & 1) * stride  # (-1) & 1 == 1: the roots (level -1) go to bufs[0]
        o_w = ((level + 1) & 1) * stride
        t_w = ((level + 1) & 1) * t_stride
        if level >= 0 and fn != 0:
            if parts & 1:
                src = bufs[level & 1]
                if not native_encrypt(fn, ctxs[0], src, enc_l, n, outl):
                    return n, -1
                if not native_encrypt(fn, ctxs[1], src, enc_r, n, outl):
                    return n, -1
            n_log = log_blocks(log, log_blocks(log, n_log, n), n)
        if level >= 0 and not parts & 2:
            # (a flat chunk's count is known: the benchmark's AES-alone timing then pays no
            # per-task loop the real passes do not run)
            n = 2 * (nk << level) if flat_ok else level_count(tasks_i, lo, hi, level, max_h, group)
            continue
        last = level + 1 == max_h
        s_base = b_addr + np.uint64(8 * s_w)
        o_base = b_addr + np.uint64(8 * o_w)
        t_base = tb_addr + np.uint64(t_w)
        # Unsigned word offsets for the unsigned indices below (int64 + uint64 is float64).
        us_w, uo_w, ut_w = np.uint64(s_w), np.uint64(o_w), np.uint64(t_w)
        if flat_ok and level >= 0:
            total = nk << level
            bases = (s_base, l_base, r_base, o_base, t_base)
            cws = cwt[(level - l0) * nk : (level - l0 + 1) * nk]
            _flat_level(cws, bases, total, level, last)  # type: ignore[arg-type]
            n = 2 * total
            continue
        pos_in = 0
        pos_out = 0
        for k in range(lo, hi):
            h = tasks_i[k, 2]
            start = max_h - h
            if start > level + 1:
                break
            key = tasks_i[k, 0]
            e = epochs[key]
            if start == level + 1:
                # The task joins: its root block (control bit in bit 0) is the next level's input
                # (no array passed to a helper: a call with array arguments costs two atomic
                # refcount updates per node).
                s0 = task_seed[k, 0]
                s1 = task_seed[k, 1]
                if last:
                    tflat[t_w + pos_out] = np.uint8(s0 & ONE)
                    base = pos_out * half_w
                    for q in range(half_w):
                        flat[o_w + 2 * (base + q)] = (s0 & CLEAR) ^ (TWO + np.uint64(q))
                        flat[o_w + 2 * (base + q) + 1] = s1 ^ e
                else:
                    flat[o_w + 2 * pos_out] = s0
                    flat[o_w + 2 * pos_out + 1] = s1
                pos_out += 1
                continue
            depth = level - start
            # Needed leaves, then the needed parents at ``depth`` and children at ``depth + 1``.
            # (group is 1 or 2: a shift, not a division, in this per-task, per-level code)
            lv = needed_leaves(h, tasks_i[k, 3], tasks_i[k, 4], group)
            sh = h - depth
            nn = (lv + (1 << sh) - 1) >> sh
            nc = (lv + (1 << (sh - 1)) - 1) >> (sh - 1)
            idx = level_off[key] + tasks_i[k, 1] + depth
            # Corrections with the control-bit correction in bit 0 (cw seeds have bit 0 clear).
            scw1 = cw_seeds[idx, 1]
            cl0 = cw_seeds[idx, 0] | (np.uint64(cw_bits[idx]) & ONE)
            cr0 = cw_seeds[idx, 0] | ((np.uint64(cw_bits[idx]) >> ONE) & ONE)
            # Unsigned indices: numba then drops its negative-index wraparound selects (~2x faster).
            pin = np.uint64(pos_in)
            po = np.uint64(pos_out)
            if last and half_w == 1:
                # One conversion block per leaf (tau <= 2): the fast path, 128-bit operations.
                # Four parents per step on 512-bit vectors (:func:`_mmo_leaf_children4`), then
                # the rest.
                n4 = nn >> 2
                for j in range(n4):
                    off = SIXTEEN * (pin + FOUR * np.uint64(j))
                    qn = po + EIGHT * np.uint64(j)
                    _mmo_leaf_children4(
                        s_base + off, l_base + off, r_base + off, (cl0, cr0, scw1), e,
                        o_base + SIXTEEN * qn, t_base + qn,
                    )  # type: ignore[call-arg]  # fmt: skip
                for i in range(4 * n4, nn):
                    off = SIXTEEN * (pin + np.uint64(i))
                    qn = po + TWO * np.uint64(i)
                    _mmo_leaf_children(
                        s_base + off, l_base + off, r_base + off, (cl0, cr0, scw1), e,
                        o_base + SIXTEEN * qn, t_base + qn,
                    )  # type: ignore[call-arg]  # fmt: skip
            elif last:
                hw = np.uint64(half_w)
                for i in range(nn):
                    p = pin + np.uint64(i)
                    a = TWO * p
                    s0 = flat[us_w + a]
                    s1 = flat[us_w + a + ONE]
                    mask = ZERO - (s0 & ONE)
                    for c in range(2):
                        if c == 0:
                            v0 = flat[ul_w + a] ^ s0 ^ (cl0 & mask)
                            v1 = flat[ul_w + a + ONE] ^ s1
                        else:
                            v0 = flat[ur_w + a] ^ s0 ^ (cr0 & mask)
                            v1 = flat[ur_w + a + ONE] ^ s1
                        qc = po + TWO * np.uint64(i) + np.uint64(c)
                        tflat[ut_w + qc] = np.uint8(v0 & ONE)
                        v0 &= CLEAR
                        v1 ^= scw1 & mask
                        ubase = TWO * qc * hw
                        for j in range(half_w):
                            jj = np.uint64(j)
                            flat[uo_w + ubase + TWO * jj] = v0 ^ (TWO + jj)
                            flat[uo_w + ubase + TWO * jj + ONE] = v1 ^ e
            else:
                # The control bit rides in bit 0 of every block: the child block, corrected, is the
                # next level's AES input as it stands (no control-bit arrays, no clearing). The
                # 128-bit form took 10% less time than the scalar one for the passes alone (100k
                # keys, depth 9; both in one process, load 3-5).
                # Four parents per step on 512-bit vectors (:func:`_mmo_children4`), then the rest.
                n4 = nn >> 2
                for j in range(n4):
                    off = SIXTEEN * (pin + FOUR * np.uint64(j))
                    _mmo_children4(
                        s_base + off, l_base + off, r_base + off, cl0, cr0, scw1,
                        o_base + SIXTEEN * (po + EIGHT * np.uint64(j)),
                    )  # type: ignore[call-arg]  # fmt: skip
                for i in range(4 * n4, nn):
                    off = SIXTEEN * (pin + np.uint64(i))
                    _mmo_children(
                        s_base + off, l_base + off, r_base + off, cl0, cr0, scw1,
                        o_base + SIXTEEN * (po + TWO * np.uint64(i)),
                    )  # type: ignore[call-arg]  # fmt: skip
            pos_out += nc
            pos_in += nn
        n = pos_out
    return n, n_log


@njit(cache=True, nogil=True)
def fd_leaves(  # noqa: C901, PLR0913, PLR0915
    enc: np.ndarray,
    blocks: np.ndarray,
    t_in: np.ndarray,
    lo: int,
    hi: int,
    tasks_i: np.ndarray,
    cw_leaf: np.ndarray,
    half_w: int,
    tau: int,
    group: int,
    party: int,
    out: np.ndarray,
    nt: bool = False,
) -> None:  # pragma: no cover - numba
    """Convert the chunk's leaves: ``y = (-1)^party * (H(s) + t * CW_leaf)`` into ``out``.

    With ``nt`` the output words are written with non-temporal stores (a large output that
    no cache would keep; the caller ends with :func:`store_fence`).

    Leaf ``i`` of a task covers points ``first + group * i ..`` (``tau`` words each); words at or
    past the task's point limit are dropped. A task has :func:`needed_leaves` leaves in the
    chunk (subtrees past its limit were skipped).
    """
    width = 2 * half_w
    ew = enc.reshape(-1)
    bw = blocks.reshape(-1)
    # Party 1 negates: y -> (y ^ sgn) - sgn with sgn = ~0 (two's complement), branch-free.
    sgn = ZERO - np.uint64(party != 0)
    e_base = np.uint64(enc.ctypes.data)  # addresses for _leaf_words_nt
    b_base = np.uint64(blocks.ctypes.data)
    o_base = np.uint64(out.ctypes.data)
    t_base = np.uint64(t_in.ctypes.data)
    pos = 0
    for k in range(lo, hi):
        key = tasks_i[k, 0]
        nl = needed_leaves(tasks_i[k, 2], tasks_i[k, 3], tasks_i[k, 4], group)
        ow0 = tasks_i[k, 3] * tau
        lim_w = tasks_i[k, 4] * tau
        room = lim_w - ow0
        n_full = min(nl, room >> 1 if width == 2 else room // width)  # leaves whose words fit
        # Unsigned indices in the hot loops (no wraparound selects).
        upos = np.uint64(pos)
        uow0 = np.uint64(ow0)
        if width == 2:
            c0 = cw_leaf[key, 0]
            c1 = cw_leaf[key, 1]
            # Two loops: the ``movnti`` of _store_nt would keep LLVM from vectorizing the
            # plain-store loop (1.75x slower) if both stores shared one loop body.
            if nt:
                # Four leaves per step, one cache line each (:func:`_leaf_line_nt`) once the
                # output reaches a line boundary (leaves before it and after the last whole
                # line one by one); with an output not 16-byte aligned, :func:`_leaf_words_nt4`.
                o_first = o_base + EIGHT * uow0
                lines = o_first & LOW4 == ZERO  # whole leaves reach a line boundary
                head = 0
                if lines:  # leaves (16 bytes each) before the first line boundary
                    head = min(np.int64(((ZERO - o_first) & LOW6) >> FOUR), n_full)
                for i in range(head):
                    ui = np.uint64(i)
                    leaf = upos + ui
                    _leaf_words_nt(
                        e_base + SIXTEEN * leaf, b_base + SIXTEEN * leaf, np.uint64(t_in[leaf]),
                        c0, c1, sgn, o_first + SIXTEEN * ui,
                    )  # type: ignore[call-arg]  # fmt: skip
                n4 = (n_full - head) >> 2
                uh = np.uint64(head)
                for j in range(n4):
                    leaf = upos + uh + FOUR * np.uint64(j)
                    o_p = o_first + SIXTEEN * (uh + FOUR * np.uint64(j))
                    if lines:
                        _leaf_line_nt(
                            e_base + SIXTEEN * leaf, b_base + SIXTEEN * leaf, t_base + leaf,
                            c0, c1, sgn, o_p,
                        )  # type: ignore[call-arg]  # fmt: skip
                    else:
                        _leaf_words_nt4(
                            e_base + SIXTEEN * leaf, b_base + SIXTEEN * leaf, t_base + leaf,
                            c0, c1, sgn, o_p,
                        )  # type: ignore[call-arg]  # fmt: skip
                for i in range(head + 4 * n4, n_full):
                    ui = np.uint64(i)
                    leaf = upos + ui
                    _leaf_words_nt(
                        e_base + SIXTEEN * leaf, b_base + SIXTEEN * leaf, np.uint64(t_in[leaf]),
                        c0, c1, sgn, o_base + EIGHT * (uow0 + TWO * ui),
                    )  # type: ignore[call-arg]  # fmt: skip
            else:
                for i in range(n_full):
                    ui = np.uint64(i)
                    leaf = upos + ui
                    mask = ZERO - np.uint64(t_in[leaf])
                    y0 = (ew[TWO * leaf] ^ bw[TWO * leaf]) + (c0 & mask)
                    y1 = (ew[TWO * leaf + ONE] ^ bw[TWO * leaf + ONE]) + (c1 & mask)
                    out[uow0 + TWO * ui] = (y0 ^ sgn) - sgn
                    out[uow0 + TWO * ui + ONE] = (y1 ^ sgn) - sgn
        else:
            uw = np.uint64(width)
            for i in range(n_full):
                ui = np.uint64(i)
                leaf = upos + ui
                mask = ZERO - np.uint64(t_in[leaf])
                base = leaf * uw
                ow = uow0 + ui * uw
                for w in range(width):
                    uw_ = np.uint64(w)
                    y = (ew[base + uw_] ^ bw[base + uw_]) + (cw_leaf[key, w] & mask)
                    if nt:
                        _store_nt(out, ow + uw_, (y ^ sgn) - sgn)  # type: ignore[call-arg]
                    else:
                        out[ow + uw_] = (y ^ sgn) - sgn
        if n_full < nl:  # one leaf cut by the limit (a 1-point domain or a short bin)
            leaf = pos + n_full
            mask = ZERO - np.uint64(t_in[leaf])
            base = leaf * width
            ow = ow0 + n_full * width
            for w in range(max(lim_w - ow, 0)):
                y = (ew[base + w] ^ bw[base + w]) + (cw_leaf[key, w] & mask)
                out[ow + w] = (y ^ sgn) - sgn
        pos += nl


@njit(cache=True, nogil=True)
def expand_nodes(  # noqa: PLR0913
    enc_l: np.ndarray,
    enc_r: np.ndarray,
    seeds: np.ndarray,
    t_in: np.ndarray,
    cw_idx: np.ndarray,
    cw_seeds: np.ndarray,
    cw_bits: np.ndarray,
    out_seed: np.ndarray,
    out_t: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Both corrected children of each node (``enc_l``/``enc_r``: AES of ``seeds``) -> out[2i+c]."""
    for node in range(t_in.shape[0]):
        idx = cw_idx[node]
        t = t_in[node]
        for c in range(2):
            kk = 2 * node + c
            if c == 0:
                v0 = enc_l[node, 0] ^ seeds[node, 0]
                v1 = enc_l[node, 1] ^ seeds[node, 1]
            else:
                v0 = enc_r[node, 0] ^ seeds[node, 0]
                v1 = enc_r[node, 1] ^ seeds[node, 1]
            tc = np.uint8(v0 & ONE)
            v0 &= CLEAR
            if t:
                v0 ^= cw_seeds[idx, 0]
                v1 ^= cw_seeds[idx, 1]
                tc ^= (cw_bits[idx] >> np.uint8(c)) & np.uint8(1)
            out_seed[kk, 0] = v0 | np.uint64(tc)
            out_seed[kk, 1] = v1
            out_t[kk] = tc


# --------------------------------------------------------------------------------------------
# Point evaluation: one AES block per point and level.
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def point_place(  # noqa: PLR0913
    cand: np.ndarray,
    n: int,
    level: int,
    pt_key: np.ndarray,
    pt_path: np.ndarray,
    tree_levels: np.ndarray,
    seed: np.ndarray,
    who: np.ndarray,
    blocks: np.ndarray,
) -> tuple[int, int]:  # pragma: no cover - numba
    """Lay out the AES inputs of tree level ``level`` for the points ``cand[:n]`` still in it.

    Points whose path bit at ``level`` is 0 come first (they go through the left key), then
    those with bit 1 (right key); ``who[pos]`` is the point at input row ``pos`` and
    ``blocks[pos]`` its seed. Returns ``(count, left_count)``.
    """
    n_left = 0
    count = 0
    for c in range(n):
        i = cand[c]
        tl = tree_levels[pt_key[i]]
        if level < tl:
            count += 1
            if (pt_path[i] >> np.uint64(tl - 1 - level)) & ONE == ZERO:
                n_left += 1
    pl = 0
    pr = n_left
    for c in range(n):
        i = cand[c]
        tl = tree_levels[pt_key[i]]
        if level < tl:
            if (pt_path[i] >> np.uint64(tl - 1 - level)) & ONE == ZERO:
                d = pl
                pl += 1
            else:
                d = pr
                pr += 1
            who[d] = i
            blocks[d, 0] = seed[i, 0]
            blocks[d, 1] = seed[i, 1]
    return count, n_left


@njit(cache=True, nogil=True)
def point_level(  # noqa: PLR0913
    enc: np.ndarray,
    blocks: np.ndarray,
    n: int,
    n_left: int,
    level: int,
    who: np.ndarray,
    pt_key: np.ndarray,
    level_off: np.ndarray,
    cw_seeds: np.ndarray,
    cw_bits: np.ndarray,
    seed: np.ndarray,
    t_state: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Follow one tree level for the ``n`` points laid out by :func:`point_place`.

    ``enc[:n_left]`` are left-key and ``enc[n_left:n]`` right-key encryptions of ``blocks``;
    updates ``seed``/``t_state`` of each point ``who[pos]``.
    """
    for pos in range(n):
        i = who[pos]
        bit = np.uint8(0) if pos < n_left else np.uint8(1)
        v0 = enc[pos, 0] ^ blocks[pos, 0]
        v1 = enc[pos, 1] ^ blocks[pos, 1]
        tc = np.uint8(v0 & ONE)
        v0 &= CLEAR
        if t_state[i]:
            idx = level_off[pt_key[i]] + level
            v0 ^= cw_seeds[idx, 0]
            v1 ^= cw_seeds[idx, 1]
            tc ^= (cw_bits[idx] >> bit) & np.uint8(1)
        seed[i, 0] = v0 | np.uint64(tc)
        seed[i, 1] = v1
        t_state[i] = tc


@njit(cache=True, nogil=True)
def point_leaf_blocks(
    seed: np.ndarray, pt_key: np.ndarray, epochs: np.ndarray, half_w: int, out: np.ndarray
) -> None:  # pragma: no cover - numba
    """Conversion inputs ``s ^ (2 + q, epoch)`` for every point's leaf seed."""
    for i in range(seed.shape[0]):
        e = epochs[pt_key[i]]
        for q in range(half_w):
            out[i * half_w + q, 0] = (seed[i, 0] & CLEAR) ^ (TWO + np.uint64(q))
            out[i * half_w + q, 1] = seed[i, 1] ^ e


@njit(cache=True, nogil=True)
def point_leaves(  # noqa: PLR0913
    enc: np.ndarray,
    blocks: np.ndarray,
    t_state: np.ndarray,
    pt_key: np.ndarray,
    pt_group: np.ndarray,
    cw_leaf: np.ndarray,
    half_w: int,
    tau: int,
    party: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Output words of each point: its ``tau`` words of the leaf group ``pt_group``."""
    for i in range(t_state.shape[0]):
        key = pt_key[i]
        t = t_state[i]
        off = pt_group[i] * tau
        for w in range(tau):
            ww = off + w
            kk = i * half_w + (ww >> 1)
            y = enc[kk, ww & 1] ^ blocks[kk, ww & 1]
            if t:
                y += cw_leaf[key, ww]
            if party:
                y = ZERO - y
            out[i, w] = y


# --------------------------------------------------------------------------------------------
# U-DPF: walk both keys of a pair down the path where their control bits differ.
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def pair_path_level(  # noqa: PLR0913
    enc_l: np.ndarray,
    enc_r: np.ndarray,
    seeds: np.ndarray,
    n: int,
    level: int,
    order: np.ndarray,
    lo: int,
    level_off: np.ndarray,
    cw_seeds: np.ndarray,
    cw_bits: np.ndarray,
    state_t: np.ndarray,
    path_bits: np.ndarray,
    bad: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Descend one level along the child whose control bits differ between the two parties.

    ``seeds[2 * i + b]`` is party ``b``'s seed (replaced by the child followed). Records the bit
    in ``path_bits[j]`` (shifted in from the right) and flags ``bad[j]`` when not exactly one
    child qualifies (the two keys are not a pair of one point function).
    """
    cs = np.empty((2, 2, 2), dtype=np.uint64)
    ct = np.empty((2, 2), dtype=np.uint8)
    for i in range(n):
        j = order[lo + i]
        idx = level_off[j] + level
        for b in range(2):
            t = state_t[i, b]
            k = 2 * i + b
            for c in range(2):
                if c == 0:
                    v0 = enc_l[k, 0] ^ seeds[k, 0]
                    v1 = enc_l[k, 1] ^ seeds[k, 1]
                else:
                    v0 = enc_r[k, 0] ^ seeds[k, 0]
                    v1 = enc_r[k, 1] ^ seeds[k, 1]
                tc = np.uint8(v0 & ONE)
                v0 &= CLEAR
                if t:
                    v0 ^= cw_seeds[idx, 0]
                    v1 ^= cw_seeds[idx, 1]
                    tc ^= (cw_bits[idx] >> np.uint8(c)) & np.uint8(1)
                cs[b, c, 0] = v0
                cs[b, c, 1] = v1
                ct[b, c] = tc
        d0 = ct[0, 0] ^ ct[1, 0]
        d1 = ct[0, 1] ^ ct[1, 1]
        if d0 == d1:
            bad[j] = 1
        a = 1 if d1 else 0
        path_bits[j] = (path_bits[j] << ONE) | np.uint64(a)
        for b in range(2):
            seeds[2 * i + b, 0] = cs[b, a, 0] | np.uint64(ct[b, a])
            seeds[2 * i + b, 1] = cs[b, a, 1]
            state_t[i, b] = ct[b, a]


@njit(cache=True, nogil=True)
def leaf_words_pair(
    enc: np.ndarray, blocks: np.ndarray, n: int, half_w: int, out: np.ndarray
) -> None:  # pragma: no cover - numba
    """``out[i, b, w]`` = word ``w`` of ``H`` of party ``b``'s leaf seed (after conversion AES)."""
    for i in range(n):
        for b in range(2):
            base = (2 * i + b) * half_w
            for w in range(2 * half_w):
                kk = base + (w >> 1)
                out[i, b, w] = enc[kk, w & 1] ^ blocks[kk, w & 1]
