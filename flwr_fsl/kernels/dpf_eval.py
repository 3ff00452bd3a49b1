"""Full-domain DPF evaluation in one numba call: the chunk loop with OpenSSL called natively.

:func:`flwr_fsl.crypto.dpf.evaluate_batch` expands many keys' trees in cache-sized chunks;
per chunk and tree level it runs two AES calls (left and right key) and one
:func:`~flwr_fsl.kernels.dpf_kernels.fd_levels` pass, then one value-key AES call and
:func:`~flwr_fsl.kernels.dpf_kernels.fd_leaves`. Driven from Python, each of those is a Python
call (about 1 us for ``cryptography``'s ``update_into``, 3 us for a numba dispatch with the
kernels' many array arguments) and a 100k-key depth-9 batch makes about 21,000 of them. Here the
same loop runs inside one ``nogil`` kernel and calls ``EVP_EncryptUpdate`` through its address
(:func:`~flwr_fsl.kernels.aes.native_encrypt`): the same kernels in the same order on the same
buffers, so the output is bit-identical to the Python driver's.

The whole evaluation releases the GIL, so servers that evaluate on several threads run
them in parallel. Outputs of at least ``dpf._NT_MIN_BYTES`` are written with non-temporal stores
(:func:`~flwr_fsl.kernels.dpf_kernels.fd_leaves` with ``nt``), where a chunk allows it between
small pieces of its value-key call (:mod:`flwr_fsl.kernels.dpf_leaves`). Evaluations with
proofs run the same loop with the leaf proofs added (:mod:`flwr_fsl.kernels.vdpf_eval`): both are
:func:`fd_core`, one loop. The Python driver stays wherever ``libcrypto`` does not load
(:func:`~flwr_fsl.kernels.aes.native_aes`).

:func:`fd_tasks` (already sorted by height) and :func:`fd_chunks` plan the tasks and chunks in
numba (:func:`fd_plan`: both, with the offsets and the length checks, in one GIL-free call);
:func:`split_level` is the native form of one step of the task splitting (keys taller than a
chunk are cut into subtrees one level at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

from flwr_fsl.kernels.aes import NativeAES, log_blocks, native_aes, native_encrypt
from flwr_fsl.kernels.dpf_kernels import (
    chunk_bounds,
    expand_nodes,
    fd_levels,
    store_fence,
)
from flwr_fsl.kernels.dpf_leaves import value_leaves
from flwr_fsl.kernels.vdpf_kernels import BLOCKS, proof_pass

PROOFS = 16
"""``parts`` bit of :func:`fd_core`: hash the leaf proofs (the checked evaluation)."""


@njit(cache=True, nogil=True)
def _finish(
    aes: tuple[int, np.ndarray],
    leaf: tuple[np.ndarray, np.ndarray, np.ndarray],
    span: tuple[int, int, int],
    tasks_i: np.ndarray,
    key: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    shape: np.ndarray,
    dest: tuple[
        np.ndarray,
        tuple[
            tuple[np.ndarray, np.ndarray],
            np.ndarray,
            np.ndarray,
            np.ndarray,
        ],
    ],
    logged: tuple[np.ndarray, int],
) -> int:  # pragma: no cover - numba
    """Value-key AES, output words and leaf proofs (``PROOFS``) of a chunk's ``cnt`` leaves.

    ``aes`` is ``(fn, ctxs)`` (:func:`fd_core`); ``leaf`` is ``(conv, t, enc)``: the leaves'
    conversion blocks and control bits as the last level of
    :func:`~flwr_fsl.kernels.dpf_kernels.fd_levels` wrote them for tasks
    ``ka..kb - 1`` (``span = (ka, kb, cnt)``), and the buffer the value-key ciphertexts go to;
    ``dest`` is ``(out, proof)`` and ``logged`` ``(log, calls so far)``. Returns the updated
    call count, or ``-1`` if OpenSSL failed.
    """
    fn, ctxs = aes
    out, proof = dest
    log, n_log = logged
    ka, kb, cnt = span
    conv, t_conv, _ = leaf
    half_w = shape[0]
    outl = np.zeros(1, dtype=np.int32)
    if not value_leaves((fn, ctxs[2], outl), leaf, (ka, kb, cnt), tasks_i, key[4], shape, out):
        return -1
    n_log = log_blocks(log, n_log, cnt * half_w)  # (one call, as the Python driver makes it)
    if not shape[5] & 8:
        return n_log
    if shape[5] & PROOFS:
        pbufs, key_first, cw_proof, proofs = proof
        leaves = (conv, t_conv, tasks_i[ka:kb])
        pkey = (key_first, key[3], cw_proof)
        if proof_pass(fn, ctxs[3], leaves, pkey, half_w, pbufs, proofs) < 0:
            return -1
        sub = pbufs[0].shape[0] // BLOCKS
        for _ in range(cnt // sub):  # cnt: the chunk's leaves, in proof batches of ``sub``
            n_log = log_blocks(log, n_log, BLOCKS * sub)
        if cnt % sub:
            n_log = log_blocks(log, n_log, BLOCKS * (cnt % sub))
    return n_log


@njit(cache=True, nogil=True)
def fd_core(
    fn: int,
    ctxs: np.ndarray,
    tasks: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    shape: np.ndarray,
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
    out: np.ndarray,
    proof: tuple[
        tuple[np.ndarray, np.ndarray],
        np.ndarray,
        np.ndarray,
        np.ndarray,
    ],
) -> int:  # pragma: no cover - numba
    """Run the chunk loop of :func:`fd_run` (with ``PROOFS``, of the checked evaluation).

    Per chunk: one :func:`~flwr_fsl.kernels.dpf_kernels.fd_levels` call (the roots, then per
    tree level the left- and right-key AES calls over the level and the pass that writes the
    next level), then :func:`_finish` on the chunk's leaves. ``scratch`` is ``(bufs, tbufs,
    log)``: the four ``(cap + 1, 2)`` level buffers (two ping-pong block buffers, then the
    left and right ciphertexts), the two control-bit buffers and the log; ``proof`` is as in
    :func:`~flwr_fsl.kernels.vdpf_eval.fd_run_checked` (unread without ``PROOFS``).

    ``shape[5]`` selects the parts that run: ``1`` the tree's AES calls, ``2`` the level
    passes, ``4`` the value-key AES calls, ``8`` the leaf conversion, ``PROOFS`` the leaf
    proofs (with ``8``). ``15`` is the plain evaluation; with any of its parts off the output
    is garbage (a profiling switch: the benchmark times the parts this way). Returns the
    number of AES calls made, or ``-1`` if OpenSSL failed.
    """
    bounds, tasks_i, task_seed, _ = tasks
    bufs, tbufs, log = scratch
    rows = 0
    for c in range(bounds.shape[0] - 1):
        rows = max(rows, bounds[c + 1] - bounds[c])
    # One row per task and level (fd_levels' corrections table); tasks descend by height.
    top = tasks_i[0, 2] if tasks_i.shape[0] else 0
    levels_scratch = (bufs, tbufs, np.empty((rows * max(top, 1), 4), dtype=np.uint64))
    half_w, group, parts = shape[0], shape[2], shape[5]
    outl = np.zeros(1, dtype=np.int32)
    pub = (key[0], key[1], key[2], key[3])
    n_log = 0
    for c in range(bounds.shape[0] - 1):
        lo = bounds[c]
        hi = bounds[c + 1]
        h = tasks_i[lo, 2]
        aes = (fn, ctxs, outl, log, n_log, parts)
        n, n_log = fd_levels(
            aes, levels_scratch, (lo, hi, -1, h, h, 0), (tasks_i, task_seed), pub, half_w, group
        )
        if n_log < 0:
            return -1
        leaf = (bufs[h & 1], tbufs[h & 1], bufs[2])
        n_log = _finish(
            (fn, ctxs), leaf, (lo, hi, n), tasks_i, key, shape, (out, proof), (log, n_log)
        )
        if n_log < 0:
            return -1
    if shape[4] != 0:
        store_fence()
    return n_log


@njit(cache=True, nogil=True)
def fd_run(
    fn: int,
    ctxs: np.ndarray,
    tasks: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    shape: np.ndarray,
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
    out: np.ndarray,
) -> int:  # pragma: no cover - numba
    """Evaluate every chunk ``bounds[c]:bounds[c + 1]`` of the tasks into ``out`` (flat words).

    ``ctxs`` holds the left, right and value AES contexts (``fn``: ``EVP_EncryptUpdate``);
    ``tasks`` is ``(bounds, tasks_i, task_seed, task_t)``; ``key`` the batch's public arrays
    ``(level_off, cw_seeds, cw_bits, epochs, cw_leaf)``; ``shape`` is ``(half_w, tau, group,
    party, nt, parts)`` (``parts``: see :func:`fd_core`); ``scratch`` as in :func:`fd_core`.
    Returns the number of AES calls made (``log`` receives their block counts, as many as
    fit), or ``-1`` if OpenSSL failed.
    """
    u = np.zeros((1, 2), dtype=np.uint64)
    i = np.zeros(1, dtype=np.int64)
    none = ((u, u), i, u, u)
    plain = shape.copy()
    plain[5] &= ~PROOFS
    return fd_core(fn, ctxs, tasks, key, plain, scratch, out, none)


@njit(cache=True, nogil=True)
def split_level(
    fn: int,
    ctxs: np.ndarray,
    nodes: tuple[np.ndarray, np.ndarray, np.ndarray],
    cws: tuple[np.ndarray, np.ndarray],
    children: tuple[np.ndarray, np.ndarray],
) -> bool:  # pragma: no cover - numba
    """Both corrected children of each parent node (see :func:`expand_nodes`).

    ``nodes`` is ``(parents, t, cw_idx)``, ``cws`` the batch's ``(cw_seeds, cw_bits)``,
    ``children`` the ``(2 n, 2)`` blocks and ``(2 n,)`` control bits written; ``ctxs[0]`` and
    ``ctxs[1]`` are the left and right AES contexts. Returns whether OpenSSL succeeded.
    """
    parents, t_in, cw_idx = nodes
    n = parents.shape[0]
    enc_l = np.empty((n + 1, 2), dtype=np.uint64)
    enc_r = np.empty((n + 1, 2), dtype=np.uint64)
    outl = np.zeros(1, dtype=np.int32)
    if not native_encrypt(fn, ctxs[0], parents, enc_l, n, outl):
        return False
    if not native_encrypt(fn, ctxs[1], parents, enc_r, n, outl):
        return False
    expand_nodes(enc_l, enc_r, parents, t_in, cw_idx, cws[0], cws[1], children[0], children[1])
    return True


@njit(cache=True, nogil=True)
def _split_rows(
    roots: tuple[np.ndarray, np.ndarray, np.ndarray], max_h: int, group: int, level_off: np.ndarray
) -> tuple[
    tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray], int
]:  # pragma: no cover - numba
    """One step of :func:`split_tasks`: the next tasks' rows and the parents to expand.

    Returns ``((tasks_i, blocks, t), (parents, t, cw_idx), small)``: tasks with points left,
    those of height ``<= max_h`` first (``small`` of them, blocks and bits copied), then both
    children of each taller one (rows set, blocks and bits left for :func:`split_level`).
    """
    tasks_i, seeds, t = roots
    n_keep = 0
    n_big = 0
    for k in range(tasks_i.shape[0]):
        if tasks_i[k, 3] < tasks_i[k, 4]:  # drop subtrees entirely past the length limit
            n_keep += 1
            if tasks_i[k, 2] > max_h:
                n_big += 1
    small = n_keep - n_big
    nxt = np.empty((small + 2 * n_big, 5), dtype=np.int64)
    nxt_s = np.empty((small + 2 * n_big, 2), dtype=np.uint64)
    nxt_t = np.empty(small + 2 * n_big, dtype=np.uint8)
    parents = np.empty((n_big, 2), dtype=np.uint64)
    p_t = np.empty(n_big, dtype=np.uint8)
    cw_idx = np.empty(n_big, dtype=np.int64)
    r = 0
    b = 0
    for k in range(tasks_i.shape[0]):
        if tasks_i[k, 3] >= tasks_i[k, 4]:
            continue
        big = 1 if tasks_i[k, 2] > max_h else 0
        row = small + 2 * b if big else r
        for c in range(1 + big):  # a child: one level down, the right one shifted
            nxt[row + c] = tasks_i[k]
            nxt[row + c, 1] += big
            nxt[row + c, 2] -= big
            nxt[row + c, 3] += c * ((1 << nxt[row + c, 2]) * group)
        if big:
            parents[b] = seeds[k]
            p_t[b] = t[k]
            cw_idx[b] = level_off[tasks_i[k, 0]] + tasks_i[k, 1]
            b += 1
        else:
            nxt_s[r] = seeds[k]
            nxt_t[r] = t[k]
            r += 1
    return (nxt, nxt_s, nxt_t), (parents, p_t, cw_idx), small


@njit(cache=True, nogil=True)
def split_all(
    aes: tuple[int, np.ndarray],
    roots: tuple[np.ndarray, np.ndarray, np.ndarray],
    shape: tuple[int, int],
    cws: tuple[np.ndarray, np.ndarray, np.ndarray],
    log: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:  # pragma: no cover - numba
    """:func:`split_tasks` in one call, with the tree AES through OpenSSL (:func:`split_level`).

    ``aes`` is ``(fn, ctxs)``, ``roots`` the tasks ``(tasks_i, blocks, t)``, ``shape`` is
    ``(max_h, group)`` and ``cws`` the batch's ``(level_off, cw_seeds, cw_bits)``. The same
    tasks in the same order and the same AES calls as :func:`split_tasks` (one level of all
    tall tasks per pair of calls), without a Python round trip and five array copies per
    level. Returns ``(tasks_i, blocks, t, calls)`` (``log`` receives the calls' block counts
    as far as it has room), ``calls = -1`` if OpenSSL failed.
    """
    fn, ctxs = aes
    max_h, group = shape
    n_log = 0
    while True:
        nxt, nodes, small = _split_rows(roots, max_h, group, cws[0])
        n_big = nodes[0].shape[0]
        if n_big == 0:
            return nxt[0], nxt[1], nxt[2], n_log
        children = (nxt[1][small:], nxt[2][small:])
        if not split_level(fn, ctxs, nodes, (cws[1], cws[2]), children):
            return nxt[0], nxt[1], nxt[2], -1
        n_log = log_blocks(log, log_blocks(log, n_log, n_big), n_big)
        roots = nxt


@njit(cache=True, nogil=True)
def fd_tasks(
    tree_levels: np.ndarray, offsets: np.ndarray, root_seeds: np.ndarray, party: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """One task per key with a point to produce: ``(tasks_i, blocks, t)`` of the tree roots.

    ``tasks_i`` rows are ``(key, 0, height, first point, point limit)``; a root's block is its
    seed with the party's control bit in bit 0. Tasks come sorted by height, tallest first,
    keys of one height in key order (a counting sort: the order a stable sort by descending
    height gives, which the chunks need; no sort and gather of the tasks afterwards).
    """
    m = tree_levels.shape[0]
    top = 0
    for j in range(m):
        top = max(top, tree_levels[j])
    count = np.zeros(top + 2, dtype=np.int64)
    for j in range(m):
        if offsets[j] < offsets[j + 1]:
            count[top - tree_levels[j] + 1] += 1
    for i in range(1, top + 2):
        count[i] += count[i - 1]  # count[top - h]: the first row of height h
    n = count[top + 1]
    tasks = np.empty((n, 5), dtype=np.int64)
    seeds = np.empty((n, 2), dtype=np.uint64)
    t = np.empty(n, dtype=np.uint8)
    bit = np.uint64(party)
    for j in range(m):
        if offsets[j] >= offsets[j + 1]:
            continue
        r = count[top - tree_levels[j]]
        count[top - tree_levels[j]] += 1
        tasks[r, 0] = j
        tasks[r, 1] = 0
        tasks[r, 2] = tree_levels[j]
        tasks[r, 3] = offsets[j]
        tasks[r, 4] = offsets[j + 1]
        seeds[r, 0] = root_seeds[j, 0] | bit
        seeds[r, 1] = root_seeds[j, 1]
        t[r] = np.uint8(party)
    return tasks, seeds, t


@njit(cache=True, nogil=True)
def fd_chunks(
    tasks_i: np.ndarray, group: int, per_leaf: int, budget: int
) -> tuple[np.ndarray, int, bool]:  # pragma: no cover - numba
    """Chunk bounds of the tasks, the level buffers' block capacity and whether heights descend.

    A task costs ``per_leaf`` AES blocks per leaf that holds a point below its limit (subtree
    skipping); chunks are cut greedily near ``budget`` (:func:`chunk_bounds`).
    """
    n = tasks_i.shape[0]
    cost = np.empty(n, dtype=np.int64)
    desc = True
    for k in range(n):
        h = tasks_i[k, 2]
        cost[k] = min(1 << h, (tasks_i[k, 4] - tasks_i[k, 3] + group - 1) // group) * per_leaf
        if k and h > tasks_i[k - 1, 2]:
            desc = False
    bounds = chunk_bounds(cost, budget)
    cap = 2
    for c in range(bounds.shape[0] - 1):
        cap = max(cap, cost[bounds[c] : bounds[c + 1]].sum())
    return bounds, cap, desc


PLAN_NEGATIVE = 1
""":func:`fd_plan` status: a length is negative."""
PLAN_TOO_LONG = 2
""":func:`fd_plan` status: a length exceeds its key's domain ``2**domain_bits``."""


@njit(cache=True, nogil=True)
def fd_plan(
    domain_bits: np.ndarray,
    lengths: np.ndarray,
    root_seeds: np.ndarray,
    party: int,
    sizes: tuple[int, int, int],
) -> tuple[
    int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int
]:  # pragma: no cover - numba
    """Plan one evaluation in one GIL-free call (issue 26: a segment's prologue).

    ``sizes`` is ``(group, per_leaf, budget)``. Returns ``(status, offsets, tasks_i, seeds, t,
    bounds, cap)``: status 0, :data:`PLAN_NEGATIVE` (checked first, over every key) or
    :data:`PLAN_TOO_LONG`; the row offsets (cumulative ``lengths``); :func:`fd_tasks` of the
    keys' tree levels (``max(domain_bits - (group - 1), 0)``); :func:`fd_chunks`' bounds and
    capacity (its tasks already descend). The same arrays the separate numpy and numba steps
    give; on a nonzero status only ``offsets`` is filled.
    """
    group, per_leaf, budget = sizes
    m = lengths.shape[0]
    offsets = np.zeros(m + 1, dtype=np.int64)
    levels = np.empty(m, dtype=np.int64)
    negative = False
    too_long = False
    for j in range(m):
        n = lengths[j]
        d = np.int64(domain_bits[j])
        if n < 0:
            negative = True
        elif n > (np.int64(1) << d):
            too_long = True
        offsets[j + 1] = offsets[j] + n
        levels[j] = d - (group - 1) if d >= group - 1 else 0
    if negative or too_long:
        status = PLAN_NEGATIVE if negative else PLAN_TOO_LONG
        no_tasks = np.empty((0, 5), dtype=np.int64)
        no_seeds = np.empty((0, 2), dtype=np.uint64)
        none = np.empty(0, dtype=np.int64)
        return status, offsets, no_tasks, no_seeds, np.empty(0, np.uint8), none, 0
    tasks_i, seeds, t = fd_tasks(levels, offsets, root_seeds, party)
    bounds, cap, _ = fd_chunks(tasks_i, group, per_leaf, budget)
    return 0, offsets, tasks_i, seeds, t, bounds, cap


class NativeMMO:
    """OpenSSL contexts (one thread's) of the DPF tree's left, right and value keys.

    Parameters
    ----------
    left, right, value : NativeAES
        Contexts under the MMO PRG's three fixed keys.

    Attributes
    ----------
    fn : int
        ``EVP_EncryptUpdate``'s address.
    ctxs : numpy.ndarray
        ``(3,)`` uint64 context addresses: left, right, value.
    """

    def __init__(self, left: NativeAES, right: NativeAES, value: NativeAES) -> None:
        self._keep = (left, right, value)
        self.fn = left.fn
        self.ctxs = np.array([left.ctx, right.ctx, value.ctx], dtype=np.uint64)


def native_mmo(keys: tuple[bytes, bytes, bytes]) -> NativeMMO | None:
    """Return contexts under the ``(left, right, value)`` keys, or ``None`` without OpenSSL."""
    ciphers = [native_aes(k) for k in keys]
    if any(c is None for c in ciphers):
        return None
    left, right, value = ciphers
    assert left is not None and right is not None and value is not None
    return NativeMMO(left, right, value)


def split_tasks(
    tasks_i: NDArray[np.int64],
    seeds: NDArray[np.uint64],
    t: NDArray[np.uint8],
    max_h: int,
    group: int,
    level_off: NDArray[np.int64],
    expand: Callable[..., None],
) -> tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]]:
    """Expand task roots one level at a time until every task has height <= ``max_h``.

    Tasks whose first point is at or past their limit are dropped (nothing of them is
    evaluated). ``expand(parents, t, cw_idx, child_seeds, child_t)`` writes both corrected
    children of each parent (AES and :func:`expand_nodes`).
    """
    while True:
        keep = tasks_i[:, 3] < tasks_i[:, 4]  # drop subtrees entirely past the length limit
        tasks_i, seeds, t = tasks_i[keep], seeds[keep], t[keep]
        big = tasks_i[:, 2] > max_h
        if not big.any():
            return tasks_i, seeds, t
        sel = tasks_i[big]
        n = sel.shape[0]
        child_s = np.empty((2 * n, 2), dtype=np.uint64)
        child_t = np.empty(2 * n, dtype=np.uint8)
        cw_idx = level_off[sel[:, 0]] + sel[:, 1]
        expand(
            np.ascontiguousarray(seeds[big]), np.ascontiguousarray(t[big]), cw_idx, child_s, child_t
        )
        child = np.repeat(sel, 2, axis=0)
        child[:, 1] += 1
        child[:, 2] -= 1
        span = np.left_shift(np.int64(1), child[:, 2]) * group
        child[1::2, 3] += span[1::2]
        tasks_i = np.concatenate([tasks_i[~big], child])
        seeds = np.concatenate([seeds[~big], child_s])
        t = np.concatenate([t[~big], child_t])


def split_native(
    native: NativeMMO,
    roots: tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]],
    shape: tuple[int, int],
    cws: tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]],
    log: list[int] | None,
) -> tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]]:
    """Run :func:`split_all` (``shape = (max_h, group)``); block counts go to ``log``.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    buf = np.zeros(128 if log is not None else 0, dtype=np.int64)  # <= 64 levels, 2 calls each
    tasks_i, seeds, t, calls = split_all((native.fn, native.ctxs), roots, shape, cws, buf)
    if calls < 0:
        raise RuntimeError("OpenSSL AES failed")
    if log is not None:
        log.extend(buf[:calls].tolist())
    return tasks_i, seeds, t


def split_expander(
    native: NativeMMO | None,
    ciphers: Callable[[], Any],
    cw_seeds: NDArray[np.uint64],
    cw_bits: NDArray[np.uint8],
    log: list[int] | None,
) -> Callable[..., None]:
    """Return ``expand(parents, t, cw_idx, child_seeds, child_t)`` for :func:`split_tasks`.

    With ``native`` the two AES calls go through OpenSSL from numba (:func:`split_level`;
    their block counts are appended to ``log`` when it is a list), else through
    ``ciphers()``'s ``left`` and ``right`` :class:`~flwr_fsl.kernels.aes.BatchedAES`.
    """

    def expand(parents, t, cw_idx, child_s, child_t):  # type: ignore[no-untyped-def]
        n = parents.shape[0]
        if native is not None:
            nodes, children = (parents, t, cw_idx), (child_s, child_t)
            if not split_level(native.fn, native.ctxs, nodes, (cw_seeds, cw_bits), children):
                raise RuntimeError("OpenSSL AES failed")
            if log is not None:
                log.extend((n, n))
            return
        aes = ciphers()
        enc_l = np.empty((n + 1, 2), dtype=np.uint64)
        enc_r = np.empty((n + 1, 2), dtype=np.uint64)
        aes.left.encrypt_prefix_into(parents, enc_l)
        aes.right.encrypt_prefix_into(parents, enc_r)
        expand_nodes(enc_l, enc_r, parents, t, cw_idx, cw_seeds, cw_bits, child_s, child_t)

    return expand


def fd_scratch(
    cap: int, log: list[int] | None, calls: int
) -> tuple[NDArray[np.uint64], NDArray[np.uint8], NDArray[np.int64]]:
    """Fresh ``(bufs, tbufs, log)`` for :func:`fd_core` with level buffers of ``cap`` blocks.

    Every buffer starts on a 64-byte line (room for ``cap + 1`` blocks, rounded up to whole
    lines): the passes move four nodes (64 bytes) per vector load and store, and a vector
    that straddles two lines costs two. The log has room for ``calls`` block counts when
    ``log`` is a list (else none).
    """
    blocks = (cap + 1 + 3) & ~3  # whole lines of four blocks
    bufs = _aligned((4, blocks, 2), np.uint64)
    tbufs = _aligned((2, (cap + 63) & ~63), np.uint8)
    return bufs, tbufs, np.zeros(calls if log is not None else 0, dtype=np.int64)


def _aligned(shape: tuple[int, ...], dtype: type[np.generic]) -> NDArray[Any]:
    """Return an uninitialized C-contiguous ``shape`` array whose data starts on a line."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + 64, dtype=np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + size].view(dtype).reshape(shape)


def run_native(
    native: NativeMMO,
    tasks: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]],
    key: tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]],
    shape: tuple[int, int, int, int, int, int],
    sizes: tuple[int, int],
    out: NDArray[np.uint64],
    log: list[int] | None,
) -> None:
    """Run :func:`fd_run` with fresh level buffers of ``sizes = (cap, max_h)``.

    ``shape`` is ``(half_w, tau, group, party, nt, parts)`` (:func:`fd_core`); the block counts
    of the AES calls are appended to ``log`` when it is a list.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    cap, max_h = sizes
    scratch = fd_scratch(cap, log, (tasks[0].shape[0] - 1) * (2 * max_h + 1))
    calls = fd_run(native.fn, native.ctxs, tasks, key, np.array(shape, np.int64), scratch, out)
    if calls < 0:
        raise RuntimeError("OpenSSL AES failed")
    if log is not None:
        log.extend(scratch[2][:calls].tolist())
