"""The value-key AES of a chunk's leaves in small pieces, each followed by its leaves' output.

A large full-domain output (hundreds of MB, written with non-temporal stores by
:func:`~flwr_fsl.kernels.dpf_kernels.fd_leaves`) is bound by memory bandwidth, OpenSSL's AES by
the AES units. Written after one value-key call over the whole chunk, the output costs its full
write time; written a few cache lines at a time between 32-block calls, the stores drain while
the next piece is encrypted (session 40's closing note has the probe measurements behind the
piece size). In the evaluator (``python benchmarks/dpf_bench.py --baseline-tree``, 100k keys of
depth 9, eight runs): 1.25-1.27x its AES calls against 1.24-1.29x for one call a chunk in the
same runs, 1.01-1.03x faster in seven of them.

:func:`value_leaves` is the entry (the value-key AES and the output words of a chunk);
:func:`uniform_head` says whether a chunk has the shape the paced pass handles (one conversion
block per leaf, every task the same number of whole leaves, outputs at one 16-byte offset in a
cache line) and :func:`paced_leaves` runs it, with the words of ``fd_leaves``. The value-key
calls are logged as the one call a chunk they replace (the benchmark's floor replays that).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flwr_fsl.kernels.aes import native_encrypt, native_encrypt_at
from flwr_fsl.kernels.dpf_kernels import fd_leaves, needed_leaves
from flwr_fsl.kernels.dpf_vectors import _leaf_line_nt, _leaf_words_nt, _load_u8

PIECE_BLOCKS = 32
"""Value-key blocks per OpenSSL call in :func:`paced_leaves` (eight output lines each; 16- and
64-block pieces were no faster in ``dpf_bench.py``)."""

_SIXTEEN = np.uint64(16)
_LOW4 = np.uint64(15)
_LOW6 = np.uint64(63)


@njit(cache=True, nogil=True)
def uniform_head(
    tasks_i: np.ndarray, span: tuple[int, int], shape: tuple[int, int, int], out: np.ndarray
) -> tuple[int, int]:  # pragma: no cover - numba
    """``(leaves per task, head leaves)`` of a chunk :func:`paced_leaves` takes, else ``(-1, 0)``.

    ``span`` is ``(lo, hi)`` (tasks ``lo .. hi - 1``), ``shape`` ``(half_w, tau, group)``.
    The chunk qualifies when ``half_w == 1``, every task has the same number of leaves, none
    cut by its point limit, and every task's output starts at the same 16-byte offset in a
    cache line (``head``: its leaves before the first line boundary).
    """
    lo, hi = span
    half_w, tau, group = shape
    if half_w != 1 or hi <= lo:
        return -1, 0
    o_base = np.uint64(out.ctypes.data)
    nl = needed_leaves(tasks_i[lo, 2], tasks_i[lo, 3], tasks_i[lo, 4], group)
    head = -1
    for k in range(lo, hi):
        ow0 = tasks_i[k, 3] * tau
        o_first = o_base + np.uint64(8 * ow0)
        if o_first & _LOW4 != 0:
            return -1, 0
        if needed_leaves(tasks_i[k, 2], tasks_i[k, 3], tasks_i[k, 4], group) != nl:
            return -1, 0
        if (tasks_i[k, 4] * tau - ow0) >> 1 < nl:  # a leaf cut by the limit
            return -1, 0
        gap = int(np.int64(((np.uint64(0) - o_first) & _LOW6) >> np.uint64(4)))  # int64 for min
        h_k = min(gap, nl)
        if head >= 0 and h_k != head:
            return -1, 0
        head = h_k
    return nl, head


@njit(cache=True, nogil=True)
def _single_leaves(
    bases: tuple[np.uint64, np.uint64, np.uint64, np.uint64],
    span: tuple[int, int, int],
    cw: tuple[np.uint64, np.uint64, np.uint64],
) -> None:  # pragma: no cover - numba
    """Leaves ``i0 .. i1 - 1`` of a task one by one (two ``movnti`` each).

    ``bases`` is ``(enc, conv, t, task output)`` addresses, ``span`` ``(pos, i0, i1)`` with
    ``pos`` the chunk position of the task's leaf 0, ``cw`` ``(c0, c1, sgn)``. Scalars only:
    arrays in a call's arguments cost reference counts on every call.
    """
    e_base, c_base, t_base, o_first = bases
    pos, i0, i1 = span
    c0, c1, sgn = cw
    for i in range(i0, i1):
        lf = np.uint64(pos + i)
        t: np.uint64 = _load_u8(t_base + lf)  # type: ignore[call-arg]
        o_p = o_first + _SIXTEEN * np.uint64(i)
        _leaf_words_nt(e_base + _SIXTEEN * lf, c_base + _SIXTEEN * lf, t, c0, c1, sgn, o_p)


@njit(cache=True, nogil=True)
def paced_leaves(
    aes: tuple[int, int, np.ndarray],
    leaf: tuple[np.ndarray, np.ndarray, np.ndarray],
    span: tuple[int, int, int, int],
    tasks_i: np.ndarray,
    cw_leaf: np.ndarray,
    tau_party: tuple[int, int],
    out: np.ndarray,
) -> bool:  # pragma: no cover - numba
    """Encrypt a chunk's conversion blocks under the value key and write its output words.

    ``aes`` is ``(fn, ctx, outl)``, ``leaf`` ``(conv, t, enc)`` as in
    :func:`~flwr_fsl.kernels.dpf_eval.fd_core`'s ``_finish``, ``span`` ``(lo, hi, leaves per
    task, head leaves)`` from :func:`uniform_head`. The words are those of
    :func:`~flwr_fsl.kernels.dpf_kernels.fd_leaves` with non-temporal stores: after each piece
    of :data:`PIECE_BLOCKS` blocks, the leaves whose blocks are encrypted are written (head
    leaves one by one, whole output lines four leaves at a time, tail leaves one by one).
    Returns whether OpenSSL wrote every block.
    """
    fn, ctx, outl = aes
    conv, t_conv, enc = leaf
    lo, hi, nl, head = span
    tau, party = tau_party
    sgn = np.uint64(0) - np.uint64(party != 0)
    c_base = np.uint64(conv.ctypes.data)
    e_base = np.uint64(enc.ctypes.data)
    t_base = np.uint64(t_conv.ctypes.data)
    o_base = np.uint64(out.ctypes.data)
    cnt = (hi - lo) * nl
    n4 = (nl - head) >> 2
    body = head + 4 * n4  # the tail leaves start here
    k, i = lo, 0  # the next leaf to write: leaf i of task k
    done = 0  # conversion blocks encrypted (one per leaf)
    while done < cnt:
        m = min(PIECE_BLOCKS, cnt - done)
        off = _SIXTEEN * np.uint64(done)
        if not native_encrypt_at(fn, ctx, (c_base + off, e_base + off), m, outl):
            return False
        done += m
        while k < hi:
            pos = (k - lo) * nl
            ready = min(done - pos, nl)  # leaves of task k whose blocks are encrypted
            if ready <= i:
                break
            c0, c1 = cw_leaf[tasks_i[k, 0], 0], cw_leaf[tasks_i[k, 0], 1]
            o_first = o_base + np.uint64(8 * tasks_i[k, 3] * tau)
            bases = (e_base, c_base, t_base, o_first)
            if i < head:
                _single_leaves(bases, (pos, i, min(head, ready)), (c0, c1, sgn))
                i = min(head, ready)
                if i < head:
                    break
            j1 = min(n4, (ready - head) >> 2)
            for j in range((i - head) >> 2, j1):
                lf = np.uint64(pos + head + 4 * j)
                o_p = o_first + _SIXTEEN * np.uint64(head + 4 * j)
                _leaf_line_nt(
                    e_base + _SIXTEEN * lf, c_base + _SIXTEEN * lf, t_base + lf, c0, c1, sgn, o_p
                )  # type: ignore[call-arg]
            i = max(i, head + 4 * j1)
            if i < body:
                break
            _single_leaves(bases, (pos, i, ready), (c0, c1, sgn))
            i = max(i, ready)
            if i < nl:
                break
            k += 1
            i = 0
    return True


@njit(cache=True, nogil=True)
def value_leaves(
    aes: tuple[int, int, np.ndarray],
    leaf: tuple[np.ndarray, np.ndarray, np.ndarray],
    span: tuple[int, int, int],
    tasks_i: np.ndarray,
    cw_leaf: np.ndarray,
    shape: np.ndarray,
    out: np.ndarray,
) -> bool:  # pragma: no cover - numba
    """Run the value-key AES of a chunk's ``cnt`` leaves and write their output words.

    ``aes`` is ``(fn, value ctx, outl)``, ``leaf`` ``(conv, t, enc)``, ``span`` ``(lo, hi,
    cnt)``, ``shape`` the evaluation's ``(half_w, tau, group, party, nt, parts)`` (``parts``
    ``4``: the AES, ``8``: the words, as in :func:`~flwr_fsl.kernels.dpf_eval.fd_core`). A
    non-temporal output of a chunk :func:`uniform_head` accepts is written between the pieces
    of :func:`paced_leaves`; any other, after one call over the chunk by
    :func:`~flwr_fsl.kernels.dpf_kernels.fd_leaves`. Returns whether OpenSSL wrote every
    block.
    """
    fn, ctx, outl = aes
    conv, t_conv, enc = leaf
    lo, hi, cnt = span
    half_w, tau, group, party, nt, parts = (
        shape[0], shape[1], shape[2], shape[3], shape[4] != 0, shape[5],
    )  # fmt: skip
    if nt and parts & 12 == 12:
        nl, head = uniform_head(tasks_i, (lo, hi), (half_w, tau, group), out)
        if nl >= 0 and (hi - lo) * nl == cnt:  # (equal whole tasks: always, checked all the same)
            return paced_leaves(aes, leaf, (lo, hi, nl, head), tasks_i, cw_leaf, (tau, party), out)
    if parts & 4 and not native_encrypt(fn, ctx, conv, enc, cnt * half_w, outl):
        return False
    if parts & 8:
        fd_leaves(enc, conv, t_conv, lo, hi, tasks_i, cw_leaf, half_w, tau, group, party, out, nt)
    return True
