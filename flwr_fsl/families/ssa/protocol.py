"""Two-server secure submodel aggregation (SSA) from DPFs and cuckoo hashing (Cui et al. 2023).

Round (Cui Fig. 4, semi-honest version, with master seeds, dummy bins, optional stash,
adaptive per-bin domains, mega-elements and count-weighting):

1. The servers publish :class:`SSAParams`: model size ``m`` (elements: coordinates, or rows
   for mega-elements), the public per-client number of elements ``k``, the row width, the
   cuckoo parameters and a fresh 16-byte hash key, and the fixed-point format.
2. All parties simple-hash ``[0, m)`` into ``B`` bins; a client cuckoo-hashes its ``<= k``
   indices into the same bins (:mod:`flwr_fsl.crypto.hashing`). For bin ``b`` holding index
   ``u`` the client makes a DPF key pair pointing at ``pos_b`` (rank of ``u`` in simple bin
   ``b``) over ``ceil(log2 |simple bin b|)`` bits with value the fixed-point payload of ``u``;
   empty bins get dummy keys ``Gen(0, 0)`` of the same shape; a stash slot gets a key over
   the whole domain. The payload of ``u`` is ``(c * dw_u, c)`` with count-weighting (``c = 1``
   with unit weights, :attr:`SSAParams.weighted` False; else the client's sample count or a
   per-row count) or ``dw_u`` without.
3. The client sends the public part of all keys (identical for both servers) and one 16-byte
   master seed per server; root seeds are ``PRF(msk_b, j)``.
4. Each server full-domain-evaluates every bin, scatters bin ``b``'s outputs to the indices
   of simple bin ``b`` and the stash outputs to all of ``[0, m)``, and adds over clients.
5. ``S0 + S1`` is, per index, ``sum_i c_i dw_i`` and ``sum_i c_i`` over the clients that
   chose it; dividing gives FedSubAvg's count-weighted average exactly (up to fixed point).

**U-DPF mode** (Cui §5, fixed submodels): with an unchanged index set and hash key, later
rounds send only a hint (a new leaf correction word per bin, ``B * tau`` words) that moves the
servers' stored keys to the new payload (:meth:`SSAClientState.next_round`,
:meth:`SSAServer.add_client_hint`).

**Threat model and leakage.** Two non-colluding, semi-honest servers. Malformed keys are
rejected with :class:`SSAInputError`; in a checked round (:attr:`SSAParams.verify`, the
default) both servers also check every client's keys — one point per key, a dummy slot for
empty bins, the count word exactly 1 with unit weights, and the value words
(:attr:`SSAParams.value_check`: by default every word within ``2T`` of zero by random
projections, :mod:`flwr_fsl.families.ssa.projected_check`; ``"exact"``: within the fixed-point
bound, :mod:`flwr_fsl.families.ssa.range_check`, 2-3x the upload) — and drop a client that fails
(:mod:`flwr_fsl.families.ssa.verify`, which says exactly what is and is not verified).
Each server alone sees its master seed and the public part,
pseudorandom and independent of the client's indices and values; their sizes depend only on
public parameters (``m``, ``k``, row width, hash key). What the *reconstructed aggregate*
reveals to both servers, by design of count-weighted averaging: per index the sum of the
chosen clients' weighted updates and the sum of their weights (unit weights: how many chose
it) — hence which indices at least one client of the round chose, and with one client in a
round, that client's whole index set.
Run rounds with several clients where that matters; across rounds with known participation
totals can be differenced, which :attr:`SSAParams.dp` (distributed differential privacy: each
server noises its own share, :mod:`flwr_fsl.families.ssa.dp`) bounds.

**Formats** (:class:`SSAParams`, :class:`SSAUpload`, the ``FSCS`` client state) are in
:mod:`flwr_fsl.families.ssa.messages`; this module re-exports them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.threads import pipelined, run_ranges, streamed
from flwr_fsl.crypto.dpf import (
    DPFKeyBatch,
    DPFPublicBatch,
)
from flwr_fsl.crypto.hashing import (
    SimpleTable,
)
from flwr_fsl.crypto.prg import random_seeds
from flwr_fsl.families.ssa.client_state import SSAClientState, same_layout
from flwr_fsl.families.ssa.client_state import layout_key as layout_key  # re-exported
from flwr_fsl.families.ssa.messages import Placement as Placement  # re-exported
from flwr_fsl.families.ssa.messages import (
    SSAInputError,
    SSAParams,
    SSAUpload,
)
from flwr_fsl.families.ssa.payload import payload_words
from flwr_fsl.families.ssa.placement import (
    key_domain_bits,
    key_lengths,
    place_indices,
    simple_table_for,
)
from flwr_fsl.families.ssa.projected_check import split_value_trailer, value_trailer
from flwr_fsl.families.ssa.server_eval import (
    ClientKeys,
    PreparedKeys,
    StartedClient,
    evaluate_checked,
    evaluate_plain,
    finish_checked,
    keeps_values,
    parse_head,
    prepare_keys,
    scatter_share,
    start_checked,
)
from flwr_fsl.families.ssa.upload import encode_keys
from flwr_fsl.families.ssa.verify import (
    KeyCheck,
    resolve_threads,
    same_digest,
    segments,
)
from flwr_fsl.submodel.aggregate import count_weighted_mean

_RANGE_POINTS = 1 << 18
"""Points per key range of an unchecked round's evaluation (one range per thread task)."""

_DIGESTS_DIFFER = (
    "key check failed: the servers' checks differ (a key with more than one point, a count "
    "word other than 1, or a value word out of range)"
)

DEFERRED_SCATTER_MAX_BYTES = 64 << 20
"""A server sums clients' evaluated shares in key order and scatters them once per read when
that sum takes at most this many bytes (``m = 2**20`` single words: 48 MiB); a larger round
scatters each client's shares as they come and holds no such sum."""


def encode_update(
    params: SSAParams,
    indices: ArrayLike,
    values: ArrayLike,
    weights: ArrayLike | float = 1.0,
    *,
    rng: np.random.Generator | None = None,
    master_seeds: tuple[bytes, bytes] | None = None,
    simple_table: SimpleTable | None = None,
    threads: int | None = None,
) -> tuple[SSAUpload, SSAClientState]:
    """Client side: turn a sparse update into DPF keys for the two servers.

    Parameters
    ----------
    params : SSAParams
        The round.
    indices : array_like
        Distinct element indices (at most ``k``).
    values : array_like
        ``(n, value_width)`` update values (deltas) of those elements.
    weights : array_like or float
        The client's sample count, or one count per element.
    rng : numpy.random.Generator, optional
        Randomness for stochastic rounding and cuckoo evictions (not secret).
    master_seeds : tuple[bytes, bytes], optional
        Fixed master seeds (tests); fresh OS randomness by default.
    simple_table : SimpleTable, optional
        The round's simple table (computed if omitted).
    threads : int, optional
        Placement and Gen threads (None: :func:`~flwr_fsl.families.ssa.verify.resolve_threads`).

    Returns
    -------
    tuple[SSAUpload, SSAClientState]
        The upload and the state to keep for U-DPF rounds.

    Raises
    ------
    ConfigurationError
        If the inputs do not fit the round.
    """
    table = simple_table if simple_table is not None else simple_table_for(params)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    payload = payload_words(params, values, weights, rng)
    if payload.shape[0] != idx.size:
        raise ConfigurationError("the number of value rows differs from the number of indices")
    placement = place_indices(params, idx, table, rng, threads := resolve_threads(threads))
    if master_seeds is None:
        master_seeds = (random_seeds(1).tobytes(), random_seeds(1).tobytes())
    gen = (master_seeds, threads, value_trailer)  # (this module's: tests patch it)
    blob, keys = encode_keys(params, placement, payload, key_domain_bits(params, table), *gen)
    return SSAUpload(blob, master_seeds), SSAClientState(params, idx, placement, keys)


def held_digest(keys: DPFKeyBatch) -> bytes:
    """Return the SHA-256 of a key batch's public part: which keys a server holds for a client.

    Both parties' batches of one client share the public part, so S0's stored batch and the
    client's own state give the same digest exactly when they are the same epoch's keys.
    """
    return hashlib.sha256(keys.public.wire_view()).digest()


def can_send_hint(
    previous: SSAClientState | None,
    params: SSAParams,
    indices: ArrayLike,
    held: bytes | None = None,
) -> bool:
    """Return True if a U-DPF hint can move ``previous``'s keys to round ``params``.

    That needs stored keys of an earlier epoch, the same index array (same order), the same
    layout (:func:`same_layout`: hashing, domain and widths) and — because a hint applied to
    other keys than the client's writes pseudorandom values into the model at the client's
    old rows — the servers' announcement that they hold exactly these keys (``held``).

    Parameters
    ----------
    previous : SSAClientState or None
        The client's keys of its last round, if kept.
    params : SSAParams
        The new round.
    indices : array_like
        The client's indices for the new round.
    held : bytes, optional
        :func:`held_digest` of the keys S0 announces it holds for this client (None: none).

    Returns
    -------
    bool
        Whether :meth:`SSAClientState.next_round` applies.
    """
    return (
        previous is not None
        and held is not None
        and hmac.compare_digest(held, held_digest(previous.keys[0]))
        and params.epoch > previous.params.epoch
        and np.array_equal(previous.indices, np.asarray(indices, np.int64).reshape(-1))
        and same_layout(previous.params, params)
    )


def encode_round(  # noqa: PLR0913
    params: SSAParams,
    indices: ArrayLike,
    values: ArrayLike,
    weights: ArrayLike | float = 1.0,
    previous: SSAClientState | None = None,
    *,
    udpf: bool = False,
    held: bytes | None = None,
    rng: np.random.Generator | None = None,
    master_seeds: tuple[bytes, bytes] | None = None,
) -> tuple[SSAUpload | bytes, SSAClientState]:
    """Client side of one SSA round: a U-DPF hint when it applies, fresh keys otherwise.

    The hint is sent iff ``udpf`` and :func:`can_send_hint` (stored keys of an earlier
    epoch, the same index array, :func:`same_layout`, and the servers hold exactly those
    keys); otherwise :func:`encode_update`. A lost reply, a failed round or a server that
    lost its keys therefore costs one round of fresh keys, never the client's place.

    Parameters
    ----------
    params : SSAParams
        The round.
    indices, values, weights
        As in :func:`encode_update`.
    previous : SSAClientState, optional
        The state this function returned in the client's last round (not modified).
    udpf : bool
        Whether the servers accept U-DPF hints this round.
    held : bytes, optional
        :func:`held_digest` of the keys the servers announce for this client.
    rng : numpy.random.Generator, optional
        Stochastic-rounding and cuckoo randomness (not secret).
    master_seeds : tuple[bytes, bytes], optional
        Fixed master seeds for fresh keys (tests); fresh OS randomness by default.

    Returns
    -------
    tuple[SSAUpload | bytes, SSAClientState]
        The upload (fresh keys) or the serialized hint (for both servers), and the state to
        keep for the next round.

    Raises
    ------
    ValueError
        If the inputs do not fit the round.
    """
    if udpf and previous is not None and can_send_hint(previous, params, indices, held):
        state = replace(previous)  # a shallow copy: next_round rebinds keys and params only
        return state.next_round(params, values, weights, rng), state
    return encode_update(params, indices, values, weights, rng=rng, master_seeds=master_seeds)


def parse_public_part(params: SSAParams, public_part: bytes) -> DPFPublicBatch:
    """Decode a client's public part and check it has exactly the round's shape.

    A round with a value check's public part ends with its trailer, which this ignores.

    Raises
    ------
    SSAInputError
        If it is malformed or its number of keys, ``tau``, domains or epochs are not the
        round's.
    """
    return parse_head(params, split_value_trailer(params, bytes(public_part))[0])


class SSAServer:
    """One server's side of an SSA round: evaluate every client's keys and add them up.

    In a checked round (``params.verify``, :mod:`flwr_fsl.families.ssa.verify`) adding a client
    also returns this server's key-check digest; given the other server's digest
    (``expect``) a client whose digest differs is rejected before anything is added, and
    :meth:`discard` takes a client added earlier back out (S0 adds first, S1 checks second).

    Parameters
    ----------
    params : SSAParams
        The round.
    party : int
        0 for S0, 1 for S1.
    previous_keys : dict[int, DPFKeyBatch], optional
        Client id -> this server's key shares from the previous epoch (U-DPF mode).
    threads : int, optional
        Threads that evaluate a client's keys (in key ranges) and add them up
        (:func:`~flwr_fsl.core.threads.run_ranges`); default: ``FLWR_FSL_SSA_THREADS``, else
        every core this process may run on. The share and digests do not depend on it.
    digest_key : bytes, optional
        Checked rounds: the round's secret key-check digest key (both servers'; None: digest v2).

    Raises
    ------
    ConfigurationError
        If ``party`` is not 0 or 1, or ``threads`` or ``digest_key`` is invalid.

    Attributes
    ----------
    keys : dict[int, DPFKeyBatch]
        Client id -> its evaluated keys, kept only in U-DPF rounds (``params.epoch >= 1``)
        so that the next round's hints can update them; in one-shot rounds (epoch 0) a
        client's keys are dropped once added, so a round holds ``O(m τ)`` words however many
        clients it has.
    """

    def __init__(
        self,
        params: SSAParams,
        party: int,
        previous_keys: dict[int, DPFKeyBatch] | None = None,
        *,
        threads: int | None = None,
        digest_key: bytes | None = None,
    ) -> None:
        if party not in (0, 1):
            raise ConfigurationError(f"party must be 0 or 1, got {party!r}")
        self.params = params
        self.party = party
        self.threads = resolve_threads(threads)
        self._table = simple_table_for(params)
        self._lengths = key_lengths(params, self._table)
        # A checked round's shares have one discard row (index m): the stash keys' dummy slot.
        rows = params.domain_size + int(params.verify)
        self._share = np.zeros((rows, params.tau), np.uint64)
        # Clients' evaluated shares are summed here in key/bin order (a contiguous add) and
        # scattered into ``_share`` once, when the share is read: one random scatter per
        # round instead of one per client (issue 26). Allocated with the first client; a
        # round too large for it scatters per client (DEFERRED_SCATTER_MAX_BYTES).
        self._defer = 8 * int(self._lengths.sum()) * params.key_tau <= DEFERRED_SCATTER_MAX_BYTES
        self._pending: NDArray[np.uint64] | None = None
        self._buffers: list[NDArray[np.uint64]] = []  # free evaluation buffers, reused
        self._in_flight = 0  # clients started (:meth:`start`) and not settled
        self._check: KeyCheck | None = None
        if params.verify:
            self._check = KeyCheck(params, party, self._lengths, self.threads, digest_key)
        self._ranges = segments(self._lengths, _RANGE_POINTS)
        self._row_offsets = np.zeros(self._lengths.shape[0] + 1, np.int64)
        np.cumsum(self._lengths, out=self._row_offsets[1:])
        self._previous = dict(previous_keys or {})
        self._clients: dict[int, None] = {}  # insertion-ordered set
        self._recent: dict[int, DPFKeyBatch] = {}  # added since forget_recent (for discard)
        self.keys: dict[int, DPFKeyBatch] = {}

    @property
    def num_clients(self) -> int:
        """Clients added so far."""
        return len(self._clients)

    @property
    def clients(self) -> tuple[int, ...]:
        """The clients added so far, in the order they were added."""
        return tuple(self._clients)

    @property
    def keeps_keys(self) -> bool:
        """Whether added clients' keys are kept for U-DPF (epoch >= 1)."""
        return self.params.epoch >= 1

    def add_client(
        self, client_id: int, public_part: bytes, master_seed: bytes, expect: bytes | None = None
    ) -> bytes | None:
        """Evaluate a client's fresh keys and add them to this server's share.

        Parameters
        ----------
        client_id, public_part, master_seed
            The client, its keys' public part and this server's master seed.
        expect : bytes, optional
            Checked rounds: the other server's digest; unless equal, nothing is added.

        Returns
        -------
        bytes or None
            This server's key-check digest (None in a round without checks).

        Raises
        ------
        SSAInputError
            If the client was already added this round, its keys are malformed or fail the
            key check; the share is unchanged then.
        """
        self._check_new(client_id)
        item = ClientKeys(client_id, public_part, master_seed, expect)
        return self.add_prepared(item, self.prepare(item))

    def add_client_hint(
        self, client_id: int, hint: bytes, expect: bytes | None = None
    ) -> bytes | None:
        """U-DPF round: update a client's stored keys with its hint and add them.

        ``expect`` and the return value as in :meth:`add_client`.

        Raises
        ------
        SSAInputError
            If there are no stored keys for the client, the hint is malformed or stale, the
            updated keys fail the key check, or the client was already added this round.
        """
        self._check_new(client_id)
        item = ClientKeys(client_id, hint, None, expect)
        return self.add_prepared(item, self.prepare(item))

    def add_clients(self, items: Sequence[ClientKeys]) -> list[bytes | ClientInputError | None]:
        """Add several clients in order, decoding each next one while this one is evaluated.

        The same as :meth:`add_client` / :meth:`add_client_hint` for each item in turn (the
        same share, digests, order of :attr:`clients` and errors), but :meth:`prepare` of
        item ``i + 1`` runs on the server's threads (:func:`~flwr_fsl.core.threads.pipelined`)
        while item ``i`` is evaluated: with two or more threads the decoding no longer
        leaves the other cores idle. Where the server :attr:`streams`, item ``i + 1`` is
        decoded and its evaluation queued before item ``i`` is settled
        (:func:`~flwr_fsl.core.threads.streamed`, :meth:`start`, :meth:`settle`). A client
        that fails is dropped alone.

        Parameters
        ----------
        items : Sequence[ClientKeys]
            The clients, in the order they are added.

        Returns
        -------
        list
            Per item, in order: its digest (None in a round without checks), or the
            :class:`~flwr_fsl.core.errors.ClientInputError` (an :class:`SSAInputError`) that
            rejected it (nothing of it was added then). Any other error propagates, after the
            clients before it were added (as when adding them one at a time).
        """
        if self.streams:

            def settle(
                item: ClientKeys, started: StartedClient | Exception
            ) -> bytes | ClientInputError | None:
                try:
                    return self.settle(item, started)
                except ClientInputError as err:
                    return err

            cancel = lambda _, started: self.cancel(started)  # noqa: E731
            return streamed(items, self.prepare, self.start, settle, cancel, self.threads)

        def use(
            item: ClientKeys, prepared: PreparedKeys | Exception
        ) -> bytes | ClientInputError | None:
            try:
                return self.add_prepared(item, prepared)
            except ClientInputError as err:
                return err

        return pipelined(items, self.prepare, use, self.threads)

    @property
    def streams(self) -> bool:
        """Whether :meth:`add_clients` queues client ``i + 1`` before it settles client ``i``.

        A checked round with the deferred scatter, on two or more threads: no thread waits at
        the end of a client, and settling one (digest, value check, verdict) runs beside the
        next one's evaluation (issue 26's 2-core speed-up; :meth:`start`, :meth:`settle`).
        """
        return self._check is not None and self._defer and self.threads > 1

    def start(
        self, item: ClientKeys, prepared: PreparedKeys | Exception
    ) -> StartedClient | Exception:
        """Queue a prepared client's checked evaluation; :meth:`settle` adds it, in order.

        A checked round with the deferred scatter (:meth:`add_client` too runs this way).
        Its shares go into the running sum segment by segment (under per-segment locks:
        another started client may add to the same rows), without a ``(points, tau)`` array
        of its own unless the exact value check reads them; :meth:`settle` or :meth:`cancel`
        takes them back out unless the client is added. Nothing else of the server changes.

        Parameters
        ----------
        item : ClientKeys
            The client.
        prepared : PreparedKeys or Exception
            :meth:`prepare` of ``item``, or the exception it raised.

        Returns
        -------
        StartedClient or Exception
            The queued evaluation, or the error that refuses the client (raised by
            :meth:`settle`, in order). Never raises a client's error.
        """
        if self._check is None or not self._defer:
            raise ConfigurationError("start/settle need a checked round with a deferred scatter")
        if isinstance(prepared, Exception):
            return prepared
        keep = keeps_values(self.params, prepared.trailer)
        buffer = self._take_buffer(prepared.keys) if keep else None
        sums = self._pending_for(prepared.keys)
        args = (item.client_id, prepared.trailer, item.expect, keep)
        try:
            started = start_checked(self.params, self._check, prepared.keys, (buffer, sums), *args)
        except ClientInputError as err:
            self._give_back(buffer)
            return err
        self._in_flight += 1
        return started

    def settle(self, item: ClientKeys, started: StartedClient | Exception) -> bytes | None:
        """Wait for a started client and add it, or refuse it (:meth:`add_prepared`'s result).

        Called in the order the clients were started. The checks and errors are
        :meth:`add_client`'s, in its order (a client already added, then its decoding, then
        its evaluation and checks); a refused client leaves nothing in the share.

        Raises
        ------
        SSAInputError
            As :meth:`add_client`.
        """
        if isinstance(started, Exception):
            self._check_new(item.client_id)
            raise started
        try:
            self._check_new(item.client_id)
        except BaseException:
            self.cancel(started)
            raise
        self._in_flight -= 1
        # The value sums are projected here alone, or on the threads when no other client is
        # queued on them (waiting behind another client's evaluation would stall this one).
        threads = 1 if self._in_flight else self.threads
        try:
            _, digest = finish_checked(started, threads)
            if item.expect is not None and not same_digest(digest, item.expect):
                started.check.take_back(started.started)  # nothing of the client stays
                raise SSAInputError(_DIGESTS_DIFFER)
        finally:
            self._give_back(started.started.values)
        self._register(item.client_id, started.keys)
        return digest

    def cancel(self, started: StartedClient | Exception) -> None:
        """Wait for a started client that will not be settled; take its shares back out."""
        if isinstance(started, Exception):
            return
        self._in_flight -= 1
        started.check.cancel(started.started)
        self._give_back(started.started.values)

    def prepare(self, item: ClientKeys) -> PreparedKeys:
        """Decode a client's keys, fresh or updated by its hint (:func:`prepare_keys`).

        Reads nothing that adding clients changes: it may run on another thread while this
        server evaluates another client (:meth:`add_clients`).

        Raises
        ------
        SSAInputError
            As :func:`~flwr_fsl.families.ssa.server_eval.prepare_keys`.
        """
        return prepare_keys(self.params, self.party, self._previous, item)

    def add_prepared(self, item: ClientKeys, prepared: PreparedKeys | Exception) -> bytes | None:
        """Evaluate a prepared client and add it (:meth:`add_client`'s second half).

        Parameters
        ----------
        item : ClientKeys
            The client (its id and ``expect``).
        prepared : PreparedKeys or Exception
            :meth:`prepare` of ``item``, or the exception it raised (raised here, after the
            check that the client is new: the same error :meth:`add_client` raises).

        Returns
        -------
        bytes or None
            As :meth:`add_client`.

        Raises
        ------
        SSAInputError
            As :meth:`add_client` and :meth:`add_client_hint`; the share is unchanged then.
        """
        self._check_new(item.client_id)
        if isinstance(prepared, Exception):
            raise prepared
        if self._in_flight:
            raise ConfigurationError("a started client is not settled yet (settle it first)")
        if self._check is not None and self._defer:
            return self.settle(item, self.start(item, prepared))
        return self._accumulate(item.client_id, prepared.keys, item.expect, prepared.trailer)

    def discard(self, client_id: int) -> None:
        """S0: take a client added since :meth:`forget_recent` back out of the share.

        S0 adds a chunk's clients before S1 checks them; one S1 rejects is discarded.

        Raises
        ------
        ConfigurationError
            If the client was not added since the last :meth:`forget_recent`.
        """
        keys = self._recent.pop(client_id, None)
        if keys is None:
            raise ConfigurationError(f"client {client_id} was not added in this chunk")
        values = self._evaluate(keys)[0]
        if not self._defer:
            self._scatter(np.uint64(0) - values)
        else:  # (a share read since the client was added left no running sum: a new one)
            self._pending_for(keys)
            self._add_to_pending(values, -1)
        self._buffers.append(values)
        del self._clients[client_id]
        self.keys.pop(client_id, None)

    def forget_recent(self, clients: Iterable[int] | None = None) -> None:
        """Stop remembering clients added since the last call (their places are final).

        ``clients`` names which (default: all of them): S0 settles one relayed chunk while
        the next one's clients are still waiting for S1's verdicts.
        """
        if clients is None:
            self._recent.clear()
        else:
            for client in clients:
                self._recent.pop(client, None)

    def share(self) -> NDArray[np.uint64]:
        """Return this server's additive share of the aggregate, ``(m, tau)`` uint64."""
        self._buffers.clear()  # the round is ending: its evaluation buffers are not kept
        if self._pending is not None:
            self._scatter(self._pending)
            self._pending = None
        return self._share[: self.params.domain_size].copy()

    def _check_new(self, client_id: int) -> None:
        if client_id in self._clients:
            raise SSAInputError(f"client {client_id} already contributed to this round")

    def _evaluate(
        self,
        keys: DPFKeyBatch,
        cid: int = 0,
        trailer: bytes | None = None,
        expect: bytes | None = None,
        add: bool = False,
    ) -> tuple[NDArray[np.uint64], bytes | None]:
        # One evaluation buffer per server, reused. With ``add`` each key range's values are
        # also added to ``_pending`` as soon as they are evaluated (while in cache; a failure
        # takes them back out), else the caller adds or subtracts them.
        buffer = self._take_buffer(keys)
        into = self._pending_for(keys) if add else None
        try:
            if self._check is not None:  # the key check, and the value check with a trailer
                args = ((buffer, into), cid, trailer, expect)
                return evaluate_checked(self.params, self._check, keys, *args)
            ranges = (self._ranges, self._row_offsets, self._lengths)
            evaluate_plain(keys, buffer, ranges, self.threads, into)
        except BaseException:
            self._buffers.append(buffer)
            raise
        return buffer, None

    def _take_buffer(self, keys: DPFKeyBatch) -> NDArray[np.uint64]:
        """Return a free ``(points, tau)`` evaluation buffer for ``keys`` (give it back after)."""
        shape = (int(self._lengths.sum()), keys.public.tau)
        while self._buffers:
            buffer = self._buffers.pop()
            if buffer.shape == shape:
                return buffer
        return np.empty(shape, np.uint64)

    def _give_back(self, buffer: NDArray[np.uint64] | None) -> None:
        if buffer is not None:  # a free evaluation buffer again
            self._buffers.append(buffer)

    def _pending_for(self, keys: DPFKeyBatch) -> NDArray[np.uint64]:
        """Return the running sum of accepted clients' shares (made with the first client)."""
        if self._pending is None:  # its pages fault in on the threads
            self._pending = np.zeros((int(self._lengths.sum()), keys.public.tau), np.uint64)
        return self._pending

    def _add_to_pending(self, values: NDArray[np.uint64], sign: int) -> None:
        """``pending += sign * values`` (row slices on the server's threads)."""
        pending = self._pending
        assert pending is not None
        bounds = np.linspace(0, values.shape[0], self.threads + 1).astype(np.int64)
        op = np.add if sign > 0 else np.subtract

        def one_slice(j: int) -> None:
            a, b = int(bounds[j]), int(bounds[j + 1])
            op(pending[a:b], values[a:b], out=pending[a:b])

        run_ranges(one_slice, self.threads, self.threads)

    def _accumulate(
        self,
        client_id: int,
        keys: DPFKeyBatch,
        expect: bytes | None,
        trailer: bytes | None = None,
    ) -> bytes | None:
        values, digest = self._evaluate(keys, client_id, trailer, expect, add=self._defer)
        try:
            if expect is not None and not same_digest(digest, expect):  # (nothing was added)
                raise SSAInputError(_DIGESTS_DIFFER)
            if not self._defer:
                self._scatter(values)
        finally:
            self._buffers.append(values)
        self._register(client_id, keys)
        return digest

    def _register(self, client_id: int, keys: DPFKeyBatch) -> None:
        """Record an added client (its keys kept for a discard by S0, and for U-DPF)."""
        self._clients[client_id] = None
        if self.party == 0:  # only S0, which adds before S1 checks, ever discards
            self._recent[client_id] = keys
        if self.keeps_keys:
            self.keys[client_id] = keys

    def _scatter(self, values: NDArray[np.uint64]) -> None:
        """Add evaluated shares (in key order, summed over clients) to their share rows."""
        scatter_share(self._share, self._table, values, self.params, self.threads)


@dataclass
class SSAResult:
    """The reconstructed aggregate of an SSA round.

    Attributes
    ----------
    sums : numpy.ndarray
        ``(m, value_width)`` float64: per element ``sum_i c_i dw_i`` (or ``sum_i dw_i``).
    counts : numpy.ndarray or None
        ``(m,)`` float64 ``sum_i c_i`` over the clients that chose the element (None without
        count-weighting).
    """

    sums: NDArray[np.float64]
    counts: NDArray[np.float64] | None

    def average(self) -> NDArray[np.float64]:
        """Count-weighted average per element (0 where no client contributed).

        The step ``sums / counts`` of :func:`flwr_fsl.submodel.aggregate.count_weighted_mean`;
        to update a model, pass :attr:`sums` and :attr:`counts` to
        :func:`~flwr_fsl.submodel.aggregate.apply_count_weighted` with the round's layout.

        Raises
        ------
        ConfigurationError
            If the round was not count-weighted.
        RoundFailedError
            If the reconstructed sums or counts are not finite.
        """
        if self.counts is None:
            raise ConfigurationError("the round was not count-weighted")
        return count_weighted_mean(self.sums, self.counts)


def reconstruct(
    params: SSAParams, share0: NDArray[np.uint64], share1: NDArray[np.uint64]
) -> SSAResult:
    """Add the two servers' shares and decode the fixed-point sums.

    Raises
    ------
    ConfigurationError
        If a share does not have shape ``(m, tau)``.
    """
    shape = (params.domain_size, params.tau)
    for s in (share0, share1):
        if np.shape(s) != shape:
            raise ConfigurationError(f"share must have shape {shape}, got {np.shape(s)}")
    total = params.fixed_point.decode(np.asarray(share0, np.uint64) + np.asarray(share1, np.uint64))
    if params.count_weighted:
        # Untouched elements reconstruct to exactly 0 (DPF correctness), so counts are exact.
        counts = total[:, -1]
        return SSAResult(total[:, :-1], counts)
    return SSAResult(total, None)
