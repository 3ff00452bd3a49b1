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

Before evaluating, a server decodes what the client sent (:func:`prepare_keys`: the public part
parsed in place and checked against the round, the root seeds derived; or the stored keys
updated by a U-DPF hint). That reads no server state, so
:meth:`~flwr_fsl.families.ssa.protocol.SSAServer.add_clients` decodes client ``i + 1`` on the
server's threads while it evaluates client ``i`` (session 30). Each key's word sums and the
running-sum add are one pass over a segment's rows
(:func:`~flwr_fsl.kernels.ring.key_sums_rows`), and the share scatter reads only each
window's own items (:func:`scatter_share`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.threads import run_ranges
from flwr_fsl.crypto.dpf import (
    DPFKeyBatch,
    DPFKeyError,
    DPFPublicBatch,
    UpdateHint,
    evaluate_batch,
    key_range,
    update_batch,
)
from flwr_fsl.crypto.hashing import SimpleTable
from flwr_fsl.families.ssa import range_check
from flwr_fsl.families.ssa.messages import SSAInputError, SSAParams
from flwr_fsl.families.ssa.placement import key_domain_bits
from flwr_fsl.families.ssa.projected_check import (
    prepare_projected,
    public_binding,
    server_projected,
    split_value_trailer,
    value_round_check,
    value_trailer_bytes,
)
from flwr_fsl.families.ssa.verify import DIGEST_BYTES, KeyCheck, StartedCheck, run_adding
from flwr_fsl.kernels.ring import scatter_rows_window, sorted_bins

__all__ = [
    "SCATTER_SPLIT_BYTES",
    "WINDOW_ROWS",
    "ClientKeys",
    "PreparedKeys",
    "StartedClient",
    "check_public",
    "evaluate_checked",
    "evaluate_plain",
    "finish_checked",
    "keeps_values",
    "parse_head",
    "prepare_keys",
    "scatter_share",
    "split_public",
    "start_checked",
]

WINDOW_ROWS = 4096
"""Fewest share rows per scatter thread (smaller rounds scatter on fewer threads)."""

SCATTER_SPLIT_BYTES = 16 << 20
"""Fewest share bytes per scatter thread. Every thread reads every item to find its own, so
a window only pays when one thread's share no longer stays in cache: at ``m = 2**20``,
``tau = 2`` (16 MiB) one thread's prefetched scatter took 27-36 ms of CPU, each of two
half-windows 52-60 ms; at ``tau = 4`` (32 MiB) one thread 125 ms, each half 68-70 ms
(session 31, 2-core EPYC VM). Half-windows then prefetched another window's row half the
time; since session 33 each prefetches its own window's items
(:func:`~flwr_fsl.kernels.ring.scatter_rows_window`): at ``tau = 2`` two half-windows took
60-73 ms of CPU together (the code before: 145-383), one whole scatter 37-59 ms (load 1-5;
a helper's microbenchmark, not in the repository), so a 16 MiB share still stays on one
thread."""


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


def parse_head(params: SSAParams, public_part: bytes | memoryview) -> DPFPublicBatch:
    """Decode the keys' public part (without a trailer) and check the round's shape.

    Raises
    ------
    SSAInputError
        If it is malformed or not the round's shape (:func:`check_public`).
    """
    try:
        public = DPFPublicBatch.from_bytes(public_part)  # type: ignore[arg-type]
    except DPFKeyError as err:
        raise SSAInputError(f"malformed public part: {err}") from None
    check_public(params, public)
    return public


def check_public(params: SSAParams, public: DPFPublicBatch) -> None:
    """Check a decoded public part has the round's shape (keys, ``tau``, proofs, domains, epoch).

    Raises
    ------
    SSAInputError
        Naming the first field that differs.
    """
    if public.num_keys != params.num_keys:
        raise SSAInputError(f"{public.num_keys} keys, the round needs {params.num_keys}")
    if public.tau != params.key_tau:
        raise SSAInputError(f"tau {public.tau}, the round needs {params.key_tau}")
    if (public.cw_proof is not None) != params.verify:
        need = "verifiable keys (with proof words)" if params.verify else "plain keys"
        raise SSAInputError(f"the round needs {need}")
    if not np.array_equal(public.domain_bits.astype(np.int64), key_domain_bits(params)):
        raise SSAInputError("key domains differ from the round's simple table")
    if np.any(public.epochs != np.uint64(params.epoch)):
        raise SSAInputError(f"keys are not at the round's epoch {params.epoch}")


@dataclass(frozen=True)
class ClientKeys:
    """What one client sent one server in a round: fresh keys or a U-DPF hint.

    Attributes
    ----------
    client_id : int
        The client.
    body : bytes
        Fresh keys: their public part; a hint: the serialized hint (with any value trailer).
    master_seed : bytes or None
        Fresh keys: this server's 16-byte master seed; None: ``body`` is a U-DPF hint.
    expect : bytes or None
        Checked rounds: the other server's check of the client (S1), or None.
    """

    client_id: int
    body: bytes
    master_seed: bytes | None = None
    expect: bytes | None = None


@dataclass(frozen=True)
class PreparedKeys:
    """A client's decoded keys, ready to evaluate (:func:`prepare_keys`).

    Attributes
    ----------
    keys : DPFKeyBatch
        This server's key shares.
    trailer : bytes or None
        The value check's trailer (None: the round has no value check).
    """

    keys: DPFKeyBatch
    trailer: bytes | None


def prepare_keys(
    params: SSAParams,
    party: int,
    previous: Mapping[int, DPFKeyBatch],
    item: ClientKeys,
) -> PreparedKeys:
    """Decode a client's keys for a server: fresh ones, or its stored ones updated by its hint.

    ``previous`` holds the server's stored keys of the last epoch (U-DPF); nothing here is
    written, so it may run on another thread while the server evaluates another client.

    Raises
    ------
    SSAInputError
        If the keys are malformed or not the round's, or (a hint) there are no stored keys
        for the client or the hint is malformed or stale.
    """
    if item.master_seed is None:
        if item.client_id not in previous:
            raise SSAInputError(f"no stored keys for client {item.client_id} (send fresh keys)")
        body, trailer = split_value_trailer(params, bytes(item.body))
        try:
            parsed = UpdateHint.from_bytes(bytes(body))
            keys = update_batch(previous[item.client_id], parsed, params.epoch)
        except (DPFKeyError, ValueError) as err:
            raise SSAInputError(f"bad hint: {err}") from None
        check_public(params, keys.public)
        return PreparedKeys(keys, trailer)
    head, trailer = split_public(params, item.body)  # no copy of the keys' part
    public = parse_head(params, head)
    try:
        keys = DPFKeyBatch.from_master_seed(party, public, bytes(item.master_seed))
    except DPFKeyError as err:
        raise SSAInputError(f"bad master seed: {err}") from None
    return PreparedKeys(keys, trailer)


def evaluate_checked(
    params: SSAParams,
    check: KeyCheck,
    keys: DPFKeyBatch,
    buffers: tuple[NDArray[np.uint64] | None, NDArray[np.uint64] | None],
    client: int,
    trailer: bytes | None,
    expect: bytes | None,
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
    started = start_checked(params, check, keys, buffers, client, trailer, expect)
    values, blob = finish_checked(started, check.threads)
    assert values is not None  # (keep_values)
    return values, blob


_Side = tuple[bytes, range_check.PreparedServerCheck] | Exception
"""The value check's side task's result: the projection seed and prepared range check."""


@dataclass
class StartedClient:
    """One client's checked evaluation queued on a server's threads (:func:`start_checked`).

    Attributes
    ----------
    params : SSAParams
        The round.
    check : KeyCheck
        The server's key check.
    keys : DPFKeyBatch
        The client's keys (this server's shares).
    started : StartedCheck
        The queued key check (and the value check's side task).
    trailer, expect
        As :func:`evaluate_checked`.
    value_sums : numpy.ndarray or None
        The projected value check's per-key value sums (None: another or no value check).
    """

    params: SSAParams
    check: KeyCheck
    keys: DPFKeyBatch
    started: StartedCheck[_Side]
    trailer: bytes | None
    expect: bytes | None
    value_sums: NDArray[np.uint64] | None


def start_checked(
    params: SSAParams,
    check: KeyCheck,
    keys: DPFKeyBatch,
    buffers: tuple[NDArray[np.uint64] | None, NDArray[np.uint64] | None],
    client: int,
    trailer: bytes | None,
    expect: bytes | None,
    keep_values: bool = True,
) -> StartedClient:
    """:func:`evaluate_checked`'s pool work, queued; :func:`finish_checked` settles it.

    Arguments as :func:`evaluate_checked`; ``keep_values`` False (with a running sum) keeps
    no output shares (:meth:`KeyCheck.start`) unless the value check reads them
    (:func:`keeps_values`). The value check's work that does not read the
    shares runs as the first queued task (the public part's digest, the key parts,
    decrypting S0's material, the FLP query); its refusal is raised by
    :func:`finish_checked`, after the evaluation, where it always was.

    Raises
    ------
    SSAInputError
        If the keys are not verifiable (nothing is queued then).
    """
    out, add_into = buffers
    keep = keep_values or keeps_values(params, trailer)
    if trailer is None or params.value_check_mode != "projected":
        plain: StartedCheck[_Side] = check.start(
            keys, out=out, client=client, add_into=add_into, keep_values=keep
        )
        return StartedClient(params, check, keys, plain, trailer, expect, None)
    sums = np.empty((keys.public.num_keys, params.value_width), np.uint64)
    blob_args = (params, keys, trailer, expect, DIGEST_BYTES)

    def side() -> _Side:
        public_hash = public_binding(params, keys.public)
        try:
            return prepare_projected(*blob_args, public_hash=public_hash)
        except Exception as err:
            return err

    started = check.start(
        keys,
        out=out,
        client=client,
        value_sums=sums,
        side=side,
        add_into=add_into,
        keep_values=keep,
    )
    return StartedClient(params, check, keys, started, trailer, expect, sums)


def keeps_values(params: SSAParams, trailer: bytes | None) -> bool:
    """Whether a client's value check reads its output shares (the exact check does)."""
    return trailer is not None and params.value_check_mode != "projected"


def finish_checked(client: StartedClient, threads: int) -> tuple[NDArray[np.uint64] | None, bytes]:
    """Wait for a started client; return its shares (None: not kept) and this server's check.

    ``threads`` project the value sums (:func:`project_shares`; 1 while another client's
    evaluation is queued on the server's pool: waiting behind it would stall this one).

    Raises
    ------
    SSAInputError
        As :func:`evaluate_checked`; nothing of the client is left in the running sum then.
    """
    check, started = client.check, client.started
    values, digest = check.finish(started)
    prepared = started.side_result()
    if client.trailer is None:
        return values, digest
    with _undo_on_error(check, started):
        if client.value_sums is None:
            assert values is not None  # (keeps_values)
            blob = value_round_check(
                client.params,
                client.keys,
                values,
                client.check.offsets,
                client.trailer,
                client.expect,
            )
            return values, digest + blob
        if isinstance(prepared, Exception):
            raise prepared
        blob = server_projected(
            client.params,
            client.keys,
            client.value_sums,
            client.trailer,
            client.expect,
            DIGEST_BYTES,
            prepared=prepared,
            threads=threads,
        )
    return values, digest + blob


@contextmanager
def _undo_on_error(check: KeyCheck, started: StartedCheck[_Side]) -> Iterator[None]:
    """Take a client's shares back out of its running sum if the block raises."""
    try:
        yield
    except BaseException:
        check.take_back(started)
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
    the stash keys' points are summed onto the first rows. The random adds run on up to
    ``threads`` threads (one per :data:`SCATTER_SPLIT_BYTES` of share), each over its own
    window of rows (:func:`~flwr_fsl.kernels.ring.scatter_rows_window`:
    no two threads write one row, and each reads only its own items: a bin's items are sorted,
    so its items in a window are one run), so the share is the same for any thread count.
    """
    n_bin = int(table.bin_offsets[-1]) + (table.num_bins if params.verify else 0)
    m = params.domain_size
    parts = max(1, min(threads, m // WINDOW_ROWS, share.nbytes // SCATTER_SPLIT_BYTES))
    if parts > 1 and not sorted_bins(table.bin_items, table.bin_offsets):
        parts = 1  # (not a simple_hash table) one window holding every row is exact
    bounds = np.linspace(0, m, parts + 1).astype(np.int64)
    bounds[-1] = share.shape[0]  # every row (the last window also holds any discard row)
    shift = int(params.verify)

    def window(j: int) -> None:
        span = (int(bounds[j]), int(bounds[j + 1]))
        scatter_rows_window(share, table.bin_items, values, table.bin_offsets, shift, span)

    run_ranges(window, parts, threads)
    if params.stash_size:
        stash = values[n_bin:].reshape(params.stash_size, -1, values.shape[1])
        summed = stash.sum(axis=0, dtype=np.uint64)
        share[: summed.shape[0]] += summed[:, : params.tau]
