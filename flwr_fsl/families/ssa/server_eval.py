"""An SSA server's checked evaluation of one client: key check and value check on every thread.

:class:`~flwr_fsl.families.ssa.protocol.SSAServer` calls :func:`evaluate_checked` for each client
of a checked round. The key check (:class:`~flwr_fsl.families.ssa.verify.KeyCheck`) evaluates
the keys in segments on the server's threads; with the projected value check (the default,
:mod:`flwr_fsl.families.ssa.projected_check`) the same segments also sum each key's value words
(no second pass over the evaluation output), the hash of the keys' public part runs as one more
task beside them, and the ``r`` projections run in column ranges on the threads
(:func:`~flwr_fsl.families.ssa.projected_check.project_shares`). Before session 29 the value
check ran after the evaluation on one thread: a second pass over the output, the hash and an
int64 matrix product (about as long as the evaluation itself at ``m = 2**20``, ``k/m = 10%``).
The digest and the check blob are the same bytes (``tests/families/ssa/test_server_check.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.threads import run_ranges
from flwr_fsl.crypto.dpf import DPFKeyBatch, evaluate_batch, key_range
from flwr_fsl.crypto.hashing import SimpleTable
from flwr_fsl.families.ssa import range_check
from flwr_fsl.families.ssa.messages import SSAInputError, SSAParams
from flwr_fsl.families.ssa.projected_check import (
    public_binding,
    server_projected,
    value_round_check,
    value_trailer_bytes,
)
from flwr_fsl.families.ssa.verify import DIGEST_BYTES, KeyCheck, run_adding
from flwr_fsl.kernels.ring import scatter_rows_window

__all__ = ["WINDOW_ROWS", "evaluate_checked", "evaluate_plain", "scatter_share", "split_public"]

WINDOW_ROWS = 4096
"""Fewest share rows per scatter thread (smaller rounds scatter on fewer threads)."""


def split_public(params: SSAParams, blob: bytes) -> tuple[bytes | memoryview, bytes | None]:
    """Split a client's public part into the keys' part and the value check's trailer.

    :func:`~flwr_fsl.families.ssa.projected_check.split_value_trailer` on the server, without
    copying the keys' part (about 21 MB at ``m = 2**20``, ``k/m = 10%``): it is a read-only
    view of ``blob``, which the parser reads in place.

    Raises
    ------
    SSAInputError
        If the blob is not longer than the round's trailer.
    """
    blob = bytes(blob)  # no copy for bytes
    size = value_trailer_bytes(params)
    if not size:
        return blob, None
    if len(blob) <= size:
        range_check.cut_trailer(blob, size)  # raises its error
        raise SSAInputError("malformed public part")  # pragma: no cover - cut_trailer raised
    return memoryview(blob)[:-size], blob[-size:]


def evaluate_checked(
    params: SSAParams,
    check: KeyCheck,
    keys: DPFKeyBatch,
    buffers: tuple[NDArray[np.uint64] | None, NDArray[np.uint64] | None],
    client: int,
    trailer: bytes | None,
    expect: bytes | None,
    offsets: NDArray[np.int64],
) -> tuple[NDArray[np.uint64], bytes]:
    """Evaluate a client's keys with the round's checks; return the shares and the whole check.

    Parameters
    ----------
    params : SSAParams
        A checked round.
    check : KeyCheck
        The server's key check (its threads run everything here).
    keys : DPFKeyBatch
        This server's shares of the client's keys.
    buffers : tuple
        ``(out, add_into)``: the server's reused ``(points, tau)`` evaluation buffer (or
        None), and its running sum of accepted clients (or None): each segment's shares are
        added to it as soon as they are evaluated (:meth:`KeyCheck.evaluate_with`). If this
        raises, nothing of the client is left in it; the caller takes the shares back out
        when it rejects the client on the returned check.
    client : int
        The client's id (the digest's nonces).
    trailer : bytes, optional
        The value check's trailer (None: the round has no value check).
    expect : bytes, optional
        The other server's check of the client (S1), or None (S0).
    offsets : numpy.ndarray
        Each key's first output row, then the total (the exact value check's input).

    Returns
    -------
    tuple
        The output shares and this server's check: the key-check digest, followed by the
        value check's blob when the round has one.

    Raises
    ------
    SSAInputError
        If the keys are not verifiable or the value-check material does not match this
        server's.
    """
    out, add_into = buffers
    if trailer is None or params.value_check_mode != "projected":
        values, digest, _ = check.evaluate_with(keys, out=out, client=client, add_into=add_into)
        if trailer is None:
            return values, digest
        with _undo_on_error(add_into, values):
            return values, digest + value_round_check(
                params, keys, values, offsets, trailer, expect
            )
    sums = np.empty((keys.public.num_keys, params.value_width), np.uint64)
    values, digest, public_hash = check.evaluate_with(
        keys,
        out=out,
        client=client,
        value_sums=sums,
        side=lambda: public_binding(params, keys.public),
        add_into=add_into,
    )
    with _undo_on_error(add_into, values):
        blob = server_projected(
            params,
            keys,
            sums,
            trailer,
            expect,
            DIGEST_BYTES,
            public_hash=public_hash,
            threads=check.threads,
        )
    return values, digest + blob


@contextmanager
def _undo_on_error(
    add_into: NDArray[np.uint64] | None, values: NDArray[np.uint64]
) -> Iterator[None]:
    """Subtract ``values`` from ``add_into`` again if the block raises."""
    try:
        yield
    except BaseException:
        if add_into is not None:
            np.subtract(add_into, values, out=add_into)
        raise


def evaluate_plain(
    keys: DPFKeyBatch,
    out: NDArray[np.uint64],
    ranges: tuple[list[tuple[int, int]], NDArray[np.int64], NDArray[np.int64]],
    threads: int,
    add_into: NDArray[np.uint64] | None = None,
) -> None:
    """Evaluate a client's keys into ``out`` in an unchecked round, key range by key range.

    ``ranges`` is ``(key ranges, row offsets, lengths)``; the ranges run on ``threads``
    threads. With ``add_into`` each range's rows are also added to it as soon as they are
    evaluated (while in cache); if this raises, the rows already added are taken back out.
    """
    key_ranges, offsets, lengths = ranges
    added: list[tuple[int, int]] = []

    def one_range(j: int) -> None:
        lo, hi = key_ranges[j]
        a, b = int(offsets[lo]), int(offsets[hi])
        evaluate_batch(key_range(keys, lo, hi), lengths=lengths[lo:hi], out=out[a:b])
        if add_into is not None:
            np.add(add_into[a:b], out[a:b], out=add_into[a:b])
            added.append((a, b))  # list.append is atomic

    run_adding(one_range, len(key_ranges), threads, (add_into, out, added))


def scatter_share(
    share: NDArray[np.uint64],
    table: SimpleTable,
    values: NDArray[np.uint64],
    params: SSAParams,
    threads: int,
) -> None:
    """Add evaluated shares (in key order, summed over clients) to their rows of ``share``.

    The bins' points go to their items' rows (a checked round skips each bin's dummy slot),
    the stash keys' points are summed onto the first rows. The random adds run on ``threads``
    threads, each over its own window of rows (:func:`~flwr_fsl.kernels.ring.scatter_rows_window`:
    no two threads write one row), so the share is the same for any thread count.
    """
    n_bin = int(table.bin_offsets[-1]) + (table.num_bins if params.verify else 0)
    bins = table.bin_offsets if params.verify else np.zeros(0, np.int64)
    m = params.domain_size
    parts = max(1, min(threads, m // WINDOW_ROWS))  # small rounds: one thread
    bounds = np.linspace(0, m, parts + 1).astype(np.int64)

    def window(j: int) -> None:
        scatter_rows_window(
            share, table.bin_items, values, bins, (int(bounds[j]), int(bounds[j + 1]))
        )

    run_ranges(window, parts, threads)
    if params.stash_size:
        stash = values[n_bin:].reshape(params.stash_size, -1, values.shape[1])
        summed = stash.sum(axis=0, dtype=np.uint64)
        share[: summed.shape[0]] += summed[:, : params.tau]
