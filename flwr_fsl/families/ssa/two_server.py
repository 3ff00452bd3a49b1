"""S0's side of two-server SSA and PSR (Cui et al.) as one Flower-free party object.

:class:`LeadServer` is S0: it holds the connection to S1 (anything with the methods of
:class:`HelperParty` — the gRPC client and its in-process twin both have them), S1's pinned
public key, and the clients' stored key shares for U-DPF. A strategy hands it the parsed
uploads of a round; the lead server runs the round in the one order that keeps both servers'
shares over the same clients:

1. S0 evaluates first, per relay chunk: a client whose keys S0 cannot evaluate is rejected
   by S0 and not relayed; in a checked round (``SSAParams.verify``, the default;
   :mod:`flwr_fsl.families.ssa.verify`) S0 computes each client's key-check digest;
2. S0 relays the others (public part + the sealed S1 material, or a U-DPF hint, and S0's
   digest): S1 evaluates, adds a client only if its own digest equals S0's, and returns its
   digest or its reason; S0 takes every client S1 rejected, or whose S1 digest differs from
   its own, back out of its share (:meth:`SSAServer.discard
   <flwr_fsl.families.ssa.protocol.SSAServer.discard>`), so a client that fails the key check
   is dropped by both servers with a reason and the others stay exact;
3. S1's share must list exactly S0's clients and have the round's shape, or the round fails;
4. only then are S0's stored U-DPF keys moved to this round's, and the aggregate
   reconstructed.

A round that fails raises :class:`~flwr_fsl.core.errors.RoundFailedError` (S1's own errors are of
that kind too); the caller leaves the model unchanged and calls :meth:`LeadServer.abort`.
Clients rejected by either server are returned with the reason so the caller drops them.

**S1 restarts.** S1 keeps a run's session (open rounds, stored U-DPF keys) in memory only, and
only ``OpenSession`` creates a session, so a restarted S1 answers every call of the old session
with :class:`SessionLostError`. :meth:`LeadServer.open` — which strategies call before any
client is asked anything in a round — handles that: S0 forgets its own stored U-DPF keys (S1's
are gone; :meth:`LeadServer.held` then announces none, so clients send fresh keys instead of
hints), opens a new session (a new id S1 draws; strategies send clients the current id every
round), re-fetches S1's public key and checks it against the pinned fingerprint, and only then
opens the round. A restart costs one round of fresh keys; rounds while S1 is down fail before
any client trains.

**S1's key.** S0 checks S1's public key against the pinned fingerprint before it opens a round
on S1 whenever it has no verified key of the current session: at the first round, and after
every lost session. A mismatch at the first contact is a bad setting
(:class:`~flwr_fsl.core.errors.ConfigurationError`: the pin or the address is wrong, the run
stops before round 1). A mismatch after S1 was verified once in the run — S1 came back from a
restart with another key file — is :class:`HelperKeyMismatchError`, a round failure: that
round fails before any client is asked anything (no client ever seals material to an
unpinned key, and none trains for nothing), the model is unchanged, and every later round
re-fetches and re-checks the key until S1 is back with the pinned one.

For PSR, :meth:`LeadServer.answer_queries` answers each client's query on S0's copy of the
table, relays the valid ones to S1 and returns, per client, S0's answer in the clear and S1's
answer sealed to the client.

**Threat model and leakage** (see :mod:`flwr_fsl.families.ssa.protocol` and
:mod:`flwr_fsl.families.ssa.psr`): two non-colluding semi-honest servers. S0 sees each client's
public key part and S0 master seed (pseudorandom given the index set), S1's material only
sealed, S1's share (uniform on its own) and the reconstructed aggregate: per element the
weighted sum and total weight of the clients that chose it. Nothing in this object reads a
sealed blob; a checked round's digest key goes to S1 only, never to a client (verify module).

**Distributed DP** (:mod:`flwr_fsl.families.ssa.dp`): in a round whose parameters carry a
:class:`~flwr_fsl.families.ssa.dp.DistributedDP`, S0 adds its own Gaussian noise to its share just
before reconstructing (S1 adds its own in ``FinishRound``), so S0 never sees the un-noised
aggregate and S1 sees only an aggregate carrying S0's noise. The account of S0's noise (the
guarantee against S1) is the strategy's run-level
:class:`~flwr_fsl.core.privacy.PrivacyAccount`, spent before each round; S1 keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.wireformat import MAX_ITEMS, MAX_MESSAGE_BYTES
from flwr_fsl.crypto.channel import SealedBoxError, public_key_fingerprint, verify_fingerprint
from flwr_fsl.crypto.dpf import DPFKeyBatch, DPFKeyError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.ssa.dp import noise_std, noise_words
from flwr_fsl.families.ssa.protocol import (
    ClientKeys,
    SSAInputError,
    SSAParams,
    SSAResult,
    SSAServer,
    held_digest,
    layout_key,
    parse_public_part,
    reconstruct,
)
from flwr_fsl.families.ssa.psr import PSRServer
from flwr_fsl.families.ssa.verify import new_digest_key, resolve_threads, same_digest

__all__ = [
    "DEFAULT_RELAY_CHUNK_BYTES",
    "ClientUpload",
    "HelperKeyMismatchError",
    "HelperParty",
    "HelperShareLike",
    "LeadServer",
    "SSARound",
    "SessionLostError",
    "TooFewClientsError",
    "TwoServerError",
]


DEFAULT_RELAY_CHUNK_BYTES = 64 << 20
"""Default most bytes of uploads S0 relays to S1 in one request (S1 evaluates each request's
clients before the next arrives; the gRPC message limit is 512 MiB)."""

_ITEM_OVERHEAD = 64  # a relayed item's framing: client id, lengths, headroom


class TwoServerError(RoundFailedError):
    """S0 and S1 disagree about a round (clients, shapes or keys): its result is discarded."""


class TooFewClientsError(RoundFailedError):
    """Fewer clients than the minimum participation are left: the round is not reconstructed.

    With one client (or a few whose other members collude with a server) the aggregate is
    that client's update; refusing such rounds is the only protection the aggregate offers.
    """


class SessionLostError(RoundFailedError):
    """S1 no longer holds this run's session (S1 restarted, or the session expired or closed).

    Everything S1 kept for the run is gone: its open rounds and its stored U-DPF keys.
    :meth:`LeadServer.open` recovers from it; raised by any other call it fails the round.
    """


class HelperKeyMismatchError(RoundFailedError):
    """S1 came back with a public key that does not match the pinned fingerprint.

    Raised when S0 re-checks S1's key after a lost session (an S1 restarted with another key
    file, or another server on S1's address). The round fails before any client is asked
    anything; S0 checks the key again at the next round's opening, so the run goes on and
    resumes as soon as S1 is back with the pinned key.
    """


class HelperShareLike(Protocol):
    """S1's result of a round: the clients in its share and the share itself."""

    @property
    def client_ids(self) -> tuple[int, ...]:
        """Clients whose keys S1 added."""
        ...

    @property
    def share(self) -> NDArray[np.uint64]:
        """S1's ``(m, tau)`` additive share."""
        ...


class HelperParty(Protocol):
    """What S0 asks of S1 (:class:`flwr_fsl.helper.HelperConnection` has these methods)."""

    @property
    def session_id(self) -> bytes:
        """The session every round and sealed blob of this run is bound to."""
        ...

    def public_key(self) -> bytes:
        """S1's raw X25519 public key."""
        ...

    def open_session(self) -> None:
        """Start (or re-start, after :class:`SessionLostError`) the run's session on S1."""
        ...

    def open_round(self, round_id: int, params: bytes, digest_key: bytes | None = None) -> None:
        """Open a round with ``SSAParams.to_bytes()`` (and a checked round's digest key)."""
        ...

    def add_clients(
        self, round_id: int, uploads: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, str]:
        """Relay ``(client, public part, sealed)``; return the rejected clients' reasons."""
        ...

    def add_client_hints(
        self, round_id: int, hints: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, str]:
        """Relay ``(client, hint, sealed binding)``; return the rejected clients' reasons."""
        ...

    def add_checked(
        self, round_id: int, items: Iterable[tuple[int, bytes, bytes, bytes]], *, hints: bool
    ) -> dict[int, str | bytes]:
        """Relay ``(client, public part or hint, sealed, S0's digest)`` of a checked round.

        Returns per client S1's digest (accepted) or S1's reason (rejected).
        """
        ...

    def finish_round(self, round_id: int) -> HelperShareLike:
        """Close the round and return S1's share."""
        ...

    def abort_round(self, round_id: int) -> None:
        """Drop an open round."""
        ...

    def set_model(self, round_id: int, table: NDArray[np.uint64]) -> None:
        """Give S1 the round's PSR table."""
        ...

    def psr_answer(
        self, round_id: int, queries: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, bytes | str]:
        """Relay PSR queries; return sealed answers or rejection reasons."""
        ...


@dataclass(frozen=True)
class ClientUpload:
    """One client's SSA upload (or PSR query) as S0 receives it.

    Attributes
    ----------
    public_part : bytes
        The DPF keys' public part (empty for a hint).
    master_seed : bytes
        S0's master seed (empty for a hint).
    sealed : bytes
        S1's material sealed to S1 (empty for a hint).
    hint : bytes or None
        A U-DPF hint instead of fresh keys.
    """

    public_part: bytes = b""
    master_seed: bytes = field(default=b"", repr=False)
    sealed: bytes = field(default=b"", repr=False)
    hint: bytes | None = None


@dataclass
class SSARound:
    """The outcome of one securely aggregated round.

    Attributes
    ----------
    result : SSAResult
        The reconstructed per-element sums and counts.
    accepted : list[int]
        The clients in the aggregate (in upload order).
    rejected : dict[int, str]
        Clients S1 rejected, with S1's reason (not in the aggregate).
    hinted : int
        How many accepted clients sent a U-DPF hint instead of fresh keys.
    """

    result: SSAResult
    accepted: list[int]
    rejected: dict[int, str]
    hinted: int


class LeadServer:
    """S0 of two-server SSA/PSR: runs each round with S1 in an order that keeps them in step.

    Parameters
    ----------
    helper : HelperParty
        The connection to S1.
    helper_fingerprint : str, optional
        Pinned fingerprint of S1's public key (64 hex digits, optionally ``sha256:``-prefixed):
        checked before S0 opens a round on S1 or hands the key to clients, again after every
        lost session. None: S0 takes S1's key as announced (clients still check their pin).
    min_clients : int
        Minimum participation: a round with fewer accepted clients is not reconstructed
        (S1 enforces its own minimum too, see ``flwr-fsl-helper --min-clients``).
    relay_chunk_bytes : int
        Most bytes of uploads relayed to S1 in one request (default 64 MiB; a single upload
        larger than this goes alone). At most half the 512 MiB message limit.
    noise_stream : PRGStream, optional
        Randomness of S0's DP noise (tests); default: a fresh ``os.urandom``-keyed stream a round.
    threads : int, optional
        S0's evaluation threads (:class:`~flwr_fsl.families.ssa.protocol.SSAServer`); default
        ``FLWR_FSL_SSA_THREADS``, else every core. S1's: the helper's environment.

    Raises
    ------
    ValueError
        If ``min_clients`` < 1 or ``relay_chunk_bytes`` or ``threads`` is out of range.
    ConfigurationError
        If ``helper_fingerprint`` is not a SHA-256 fingerprint (64 hex digits).

    Attributes
    ----------
    max_layouts : int
        Layouts whose U-DPF keys S0 keeps (:meth:`keys_of`), least recently used dropped first
        (1: a round of another layout forgets every key; a mixed round keeps one per table).
    session_losses : list[int]
        Rounds at whose opening S0 found that S1 had lost the session (and so forgot its
        stored U-DPF keys), in order.
    key_mismatches : list[int]
        Rounds that failed because S1's re-fetched key did not match the pinned fingerprint
        (:class:`HelperKeyMismatchError`), in order.
    """

    def __init__(
        self,
        helper: HelperParty,
        helper_fingerprint: str | None = None,
        min_clients: int = 2,
        relay_chunk_bytes: int = DEFAULT_RELAY_CHUNK_BYTES,
        noise_stream: PRGStream | None = None,
        threads: int | None = None,
    ) -> None:
        self.threads = None if threads is None else resolve_threads(threads)
        if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
            raise ConfigurationError(f"min_clients must be an integer >= 1, got {min_clients!r}")
        if (
            isinstance(relay_chunk_bytes, bool)
            or not isinstance(relay_chunk_bytes, int)
            or not 1 <= relay_chunk_bytes <= MAX_MESSAGE_BYTES // 2
        ):
            raise ConfigurationError(
                f"relay_chunk_bytes must be an integer in [1, {MAX_MESSAGE_BYTES // 2}], "
                f"got {relay_chunk_bytes!r}"
            )
        if helper_fingerprint is not None:
            _check_fingerprint_format(helper_fingerprint)
        self.min_clients = min_clients
        self.relay_chunk_bytes = relay_chunk_bytes
        self.helper = helper
        self.helper_fingerprint = helper_fingerprint
        self._stores: dict[tuple[object, ...], dict[int, DPFKeyBatch]] = {}
        self.max_layouts = 1
        self._helper_key: bytes | None = None
        self._open: dict[int, bytes | None] = {}  # round open on S1 -> its secret digest key
        self.noise_stream = noise_stream
        self.session_losses: list[int] = []
        self.key_mismatches: list[int] = []
        self._key_verified = False  # S1's key matched the pin once in this run

    @property
    def stored_keys(self) -> dict[int, DPFKeyBatch]:
        """Client -> S0's key shares of its latest accepted upload (U-DPF), latest layout."""
        return next(reversed(self._stores.values()), {})

    def keys_of(self, params: SSAParams) -> dict[int, DPFKeyBatch]:
        """Client -> S0's stored U-DPF keys of ``params``' layout (empty: none)."""
        return self._stores.get(layout_key(params), {})

    @property
    def session_id(self) -> bytes:
        """The S1 session of this run (clients bind their sealed material to it)."""
        return self.helper.session_id

    def helper_key(self) -> bytes:
        """Return S1's public key, checked against the pinned fingerprint.

        Fetched and checked once per S1 session (again after a lost session, see :meth:`open`);
        a key that does not match is never cached: the next call fetches and checks again.

        Raises
        ------
        ConfigurationError
            If S1's key does not match the pinned fingerprint and no key of S1 ever did in
            this run (a wrong pin or a wrong address: a bad setting).
        HelperKeyMismatchError
            If it does not match after S1's key matched earlier in the run (S1 came back
            with another key): the caller fails the round.
        RoundFailedError
            If S1 cannot be reached.
        """
        if self._helper_key is None:
            key = self.helper.public_key()
            if self.helper_fingerprint:
                try:
                    verify_fingerprint(key, self.helper_fingerprint)
                except SealedBoxError:
                    raise self._mismatch(key) from None
            self._helper_key = key
            self._key_verified = True
        return self._helper_key

    def _mismatch(self, key: bytes) -> ConfigurationError | HelperKeyMismatchError:
        """Return the error for an S1 key that does not match the pin (see :meth:`helper_key`)."""
        try:
            actual = public_key_fingerprint(key)
        except SealedBoxError:  # not a 32-byte key
            actual = f"<a malformed {len(key)}-byte key>"
        pinned = str(self.helper_fingerprint).strip().lower().removeprefix("sha256:")
        if not self._key_verified:
            return ConfigurationError(
                f"helper_fingerprint (ssa-helper-fingerprint): S1's public key fingerprint "
                f"{actual} does not match the pinned {pinned}: wrong pin or wrong S1 address"
            )
        return HelperKeyMismatchError(
            f"S1's public key fingerprint mismatch: S1 came back with key {actual}, which "
            f"does not match the pinned {pinned}; the round fails before any client is asked "
            "anything and the model is unchanged; S0 checks S1's key again every round"
        )

    def held(self, client: int, params: SSAParams | None = None) -> bytes | None:
        """Return the digest of the keys S0 holds for ``client`` (None: none), for its round.

        ``params``: the round, whose layout's keys count (None: the latest layout's). A client sends
        a hint only when this equals its keys' digest
        (:func:`~flwr_fsl.families.ssa.protocol.can_send_hint`): a hint is never applied to keys it
        was not made for.
        """
        keys = (self.stored_keys if params is None else self.keys_of(params)).get(client)
        return None if keys is None else held_digest(keys)

    def check_upload(
        self, params: SSAParams, client: int, upload: ClientUpload, *, accept_hints: bool
    ) -> None:
        """Check what S0 can check of an upload before relaying it (keys' shape, seed).

        Raises
        ------
        SSAInputError
            If the keys do not fit the round, or a hint comes without stored keys.
        """
        if upload.hint is not None:
            if not accept_hints or client not in self.keys_of(params):
                raise SSAInputError("U-DPF hint without stored keys")
            if not upload.sealed:
                raise SSAInputError("U-DPF hint without its binding sealed to S1")
            return
        try:
            DPFKeyBatch.from_master_seed(
                0, parse_public_part(params, upload.public_part), upload.master_seed
            )
        except DPFKeyError as err:
            raise SSAInputError(f"bad keys: {err}") from None

    def open(self, params: SSAParams) -> None:
        """Open ``params.round_id`` on S1 (once per round); recover from a lost session.

        Call it before announcing :meth:`held` digests or asking clients anything: it is the
        round's reachability check, and where S0 learns that S1 lost the session (restart,
        expiry). Then S0 forgets every stored U-DPF key (S1 holds none: a hint could only be
        rejected) and S1's cached public key, records the round in :attr:`session_losses`,
        re-opens the session, re-fetches and checks S1's key against the pin, and opens the
        round. With a pin, S0 never opens a round on an S1 whose key it has not checked in the
        session. A checked round's fresh secret digest key goes to S1 here, and to no client.

        Raises
        ------
        HelperKeyMismatchError
            If S1's key no longer matches the pin (the round is not opened; the caller fails
            it, and the next call checks again).
        ConfigurationError
            If S1's key has never matched the pin in this run (see :meth:`helper_key`).
        RoundFailedError
            If S1 cannot be reached or refuses the round (the caller fails the round).
        """
        if params.round_id in self._open:
            return
        if self.max_layouts == 1 and params.epoch and layout_key(params) not in self._stores:
            # Keys of another hashing/layout can never be updated again (S1 drops its own too).
            self.forget_keys()
        try:
            self._check_key(params.round_id)
            key = self._open_on_s1(params)
        except SessionLostError:
            self.forget_keys()
            self._helper_key = None  # a restarted S1 may hold another key: fetch and check
            self._open.clear()  # rounds of the lost session (and their keys) are gone on S1
            self.session_losses.append(params.round_id)
            self.helper.open_session()
            self._check_key(params.round_id)
            key = self._open_on_s1(params)
        self._open[params.round_id] = key  # kept until the round is finished or aborted

    def _open_on_s1(self, params: SSAParams) -> bytes | None:
        """Open the round on S1, a checked one with a fresh secret digest key (returned)."""
        key = new_digest_key() if params.verify else None
        self.helper.open_round(params.round_id, params.to_bytes(), key)
        return key

    def _check_key(self, round_id: int) -> None:
        """Check S1's key against the pin before opening a round (no-op without a pin)."""
        if not self.helper_fingerprint:
            return
        try:
            self.helper_key()
        except HelperKeyMismatchError:
            self.key_mismatches.append(round_id)
            raise

    def forget_keys(self) -> None:
        """Drop every stored U-DPF key: clients are told to send fresh keys next time."""
        self._stores.clear()

    def aggregate(
        self,
        params: SSAParams,
        uploads: Mapping[int, ClientUpload] | Iterable[tuple[int, ClientUpload]],
    ) -> SSARound:
        """Securely aggregate a round's uploads with S1 (opens the round if needed).

        Uploads go to S1 in chunks of at most :attr:`relay_chunk_bytes`; S0 evaluates the next
        chunk while S1 evaluates the relayed one, so either server holds ``O(m τ)`` words plus
        two chunks however many clients there are (plus every client's keys in U-DPF rounds,
        which the protocol must keep); given an iterator, S0 holds at most two chunks.

        Parameters
        ----------
        params : SSAParams
            The round.
        uploads : Mapping[int, ClientUpload] or iterable of (int, ClientUpload)
            Client -> its upload, each already passed :meth:`check_upload`, each client once.

        Returns
        -------
        SSARound
            The reconstructed aggregate and who is in it.

        Raises
        ------
        RoundFailedError
            If S1 fails, S0 and S1 disagree (:class:`TwoServerError`) or fewer than
            ``min_clients`` clients are left (:class:`TooFewClientsError`). The round is left
            open on S1: call :meth:`abort`.
        """
        round_id = params.round_id
        if isinstance(uploads, Mapping):
            if len(uploads) < self.min_clients:
                raise TooFewClientsError(
                    f"{len(uploads)} valid uploads, the minimum participation is {self.min_clients}"
                )
            uploads = uploads.items()
        self.open(params)
        key = self._open[round_id]  # S1 has it (None: an unchecked round)
        server0 = SSAServer(params, 0, self.keys_of(params), threads=self.threads, digest_key=key)
        rejected, hinted = self._aggregate_chunks(params, server0, uploads)
        accepted = list(server0.clients)
        if len(accepted) < self.min_clients:
            # Nothing is reconstructed: S0 does not even ask S1 for its share.
            raise TooFewClientsError(
                f"{len(accepted)} clients accepted by S1, the minimum participation is "
                f"{self.min_clients}"
            )
        share1 = self.helper.finish_round(round_id)
        self._open.pop(round_id, None)  # the round and its digest key end here
        if sorted(share1.client_ids) != sorted(accepted):
            raise TwoServerError(
                f"S1 aggregated clients {sorted(share1.client_ids)}, S0 {sorted(accepted)}"
            )
        shape = (params.domain_size, params.tau)
        if share1.share.shape != shape:
            raise TwoServerError(f"S1's share has shape {share1.share.shape}, expected {shape}")
        # Only a round both servers completed moves S0's stored keys (S1 moved its own).
        if server0.keeps_keys:
            store = self._stores.pop(layout_key(params), {})
            store.update(server0.keys)
            self._stores[layout_key(params)] = store  # the most recently used layout last
            while len(self._stores) > self.max_layouts:
                del self._stores[next(iter(self._stores))]
        share0 = server0.share()
        if params.dp is not None:
            # S0's noise, added before S0 sees anything of S1's share in the sum: it is what
            # protects the clients against S1 (S1's noise protects them against S0).
            sigma = noise_std(params.dp, params.num_items, params.value_width, params.frac_bits)
            share0 += noise_words(shape, sigma, params.fixed_point, self.noise_stream)
        result = reconstruct(params, share0, share1.share)
        return SSARound(result, accepted, rejected, len(hinted & set(accepted)))

    def _aggregate_chunks(
        self,
        params: SSAParams,
        server0: SSAServer,
        uploads: Iterable[tuple[int, ClientUpload]],
    ) -> tuple[dict[int, str], set[int]]:
        """Run every relay chunk through both servers; return the rejected and hinted clients.

        S1 evaluates chunk i (the relay runs in a thread) while S0 evaluates chunk i + 1, so
        both servers work at once (issue 26). One relay is in flight at a time, and a chunk's
        verdicts are settled before the next chunk is relayed.
        """
        rejected: dict[int, str] = {}
        hinted: set[int] = set()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsl-relay") as relays:
            in_flight: tuple[Future[dict[int, str]], list[tuple[int, ClientUpload]]] | None
            in_flight = None
            for chunk in _relay_chunks(uploads, self.relay_chunk_bytes):
                relay, digests = self._evaluate_chunk(server0, chunk, rejected)
                if in_flight is not None:
                    self._settle_chunk(server0, *in_flight, rejected, hinted)
                in_flight = (relays.submit(self._relay, params, relay, digests), relay)
            if in_flight is not None:
                self._settle_chunk(server0, *in_flight, rejected, hinted)
        return rejected, hinted

    def _evaluate_chunk(
        self,
        server0: SSAServer,
        chunk: list[tuple[int, ClientUpload]],
        rejected: dict[int, str],
    ) -> tuple[list[tuple[int, ClientUpload]], dict[int, bytes | None]]:
        """S0 evaluates one chunk first (add_clients); return the clients to relay, S0's digests.

        In a checked round S0's key-check digest of each client travels with its upload; S1
        adds the client only if its own digest is equal and returns it; a client whose S1
        digest differs fails the round (:meth:`aggregate`'s client-list check: S1 added a
        client S0 drops). A client S0 cannot evaluate is rejected by S0 and never relayed.
        """
        digests: dict[int, bytes | None] = {}
        relay: list[tuple[int, ClientUpload]] = []
        items = [
            ClientKeys(client, upload.hint, None)
            if upload.hint is not None
            else ClientKeys(client, upload.public_part, upload.master_seed)
            for client, upload in chunk
        ]
        for (client, upload), result in zip(chunk, server0.add_clients(items), strict=True):
            if isinstance(result, ClientInputError):
                rejected[client] = f"rejected by S0: {result}"
                if upload.hint is not None:
                    self.keys_of(server0.params).pop(client, None)  # send fresh keys next time
                continue
            digests[client] = result
            relay.append((client, upload))
        return relay, digests

    def _settle_chunk(
        self,
        server0: SSAServer,
        verdicts: Future[dict[int, str]],
        relay: list[tuple[int, ClientUpload]],
        rejected: dict[int, str],
        hinted: set[int],
    ) -> None:
        """S0 takes back every client of a relayed chunk that S1 rejected."""
        now = verdicts.result()
        for client, upload in relay:
            if client in now:
                server0.discard(client)
                if upload.hint is not None:
                    # S1 cannot use the hint (e.g. it lost its keys): forget S0's copy, so the
                    # client sends fresh keys next time instead of being dropped every round.
                    self.keys_of(server0.params).pop(client, None)
            elif upload.hint is not None:
                hinted.add(client)
        server0.forget_recent([client for client, _ in relay])
        rejected.update(now)

    def _relay(
        self,
        params: SSAParams,
        relay: list[tuple[int, ClientUpload]],
        digests: Mapping[int, bytes | None],
    ) -> dict[int, str]:
        """Relay the clients S0 added to S1; return those S1 rejected (or checked otherwise)."""
        fresh = [(c, u) for c, u in relay if u.hint is None]
        hints = [(c, u) for c, u in relay if u.hint is not None]
        now: dict[int, str] = {}
        if not params.verify:
            if fresh:
                rows = [(c, u.public_part, u.sealed) for c, u in fresh]
                now.update(self.helper.add_clients(params.round_id, rows))
            if hints:
                rows = [(c, u.hint or b"", u.sealed) for c, u in hints]
                now.update(self.helper.add_client_hints(params.round_id, rows))
            return now
        for group, is_hint in ((fresh, False), (hints, True)):
            if not group:
                continue
            items = [
                (c, (u.hint or b"") if is_hint else u.public_part, u.sealed, digests[c] or b"")
                for c, u in group
            ]
            answers = self.helper.add_checked(params.round_id, items, hints=is_hint)
            for client, _ in group:
                answer = answers.get(client, "S1 returned no answer")
                if isinstance(answer, str):
                    now[client] = f"rejected by S1: {answer}"
                elif not same_digest(answer, digests[client]):
                    now[client] = "key check failed: S1's digest differs from S0's"
        return now

    def answer_queries(
        self,
        params: SSAParams,
        table: NDArray[np.uint64],
        queries: Mapping[int, ClientUpload],
    ) -> dict[int, tuple[bytes, bytes] | str]:
        """Answer PSR queries on S0 and S1 (opens the round and gives S1 the table).

        Parameters
        ----------
        params : SSAParams
            The round (its hashing; ``value_width`` = the table's row width).
        table : numpy.ndarray
            ``(m, value_width)`` uint64 ring words of the table
            (:func:`flwr_fsl.families.ssa.psr.encode_table`).
        queries : Mapping[int, ClientUpload]
            Client -> its PSR query.

        Returns
        -------
        dict[int, tuple[bytes, bytes] | str]
            Client -> (S0's answer words, S1's sealed answer), or why the query was rejected.

        Raises
        ------
        RoundFailedError
            If S1 fails; the round is open on S1: call :meth:`abort`.
        """
        server0 = PSRServer(params, 0, table)
        out: dict[int, tuple[bytes, bytes] | str] = {}
        answers0: dict[int, bytes] = {}
        for client, query in queries.items():
            try:
                answers0[client] = server0.answer(query.public_part, query.master_seed).tobytes()
            except ClientInputError as err:
                out[client] = str(err)
        if not answers0:
            return out
        self.open(params)
        self.helper.set_model(params.round_id, table)
        answers1 = self.helper.psr_answer(
            params.round_id,
            [(c, queries[c].public_part, queries[c].sealed) for c in answers0],
        )
        for client in answers0:
            answer1 = answers1.get(client, "S1 returned no answer")
            if isinstance(answer1, str):
                out[client] = f"rejected by S1: {answer1}"
            else:
                out[client] = (answers0[client], answer1)
        return out

    def abort(self, round_id: int) -> str | None:
        """Release ``round_id`` on S1 after a failure; return why that failed, if it did.

        A round this object never opened (or already finished) is not S1's to release.
        """
        if round_id not in self._open:
            return None
        del self._open[round_id]  # its digest key (if any) goes with it
        try:
            self.helper.abort_round(round_id)
        except RoundFailedError as err:  # not open on S1, or S1 gone: nothing to release
            return str(err)
        return None


def _check_fingerprint_format(fingerprint: str) -> None:
    """Check that a pinned fingerprint is a SHA-256 in hex (before any call to S1).

    Raises
    ------
    ConfigurationError
        If it is not a str of 64 hex digits (optionally ``sha256:``-prefixed).
    """
    if not isinstance(fingerprint, str):
        raise ConfigurationError(
            f"helper_fingerprint must be a str, got {type(fingerprint).__name__}"
        )
    digits = fingerprint.strip().lower().removeprefix("sha256:")
    if digits and (len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits)):
        raise ConfigurationError(
            "helper_fingerprint (ssa-helper-fingerprint) must be 64 hex digits (SHA-256)"
        )


def _upload_bytes(upload: ClientUpload) -> int:
    """Bytes an upload adds to a relay request (its fields plus framing)."""
    hint = upload.hint or b""
    return len(upload.public_part) + len(upload.sealed) + len(hint) + _ITEM_OVERHEAD


def _relay_chunks(
    uploads: Iterable[tuple[int, ClientUpload]], max_bytes: int
) -> Iterator[list[tuple[int, ClientUpload]]]:
    """Group uploads into chunks of at most ``max_bytes`` (one upload alone may exceed it).

    Raises
    ------
    TwoServerError
        If one upload does not fit in a message to S1 at all.
    """
    chunk: list[tuple[int, ClientUpload]] = []
    size = 0
    for client, upload in uploads:
        n = _upload_bytes(upload)
        if n > MAX_MESSAGE_BYTES - _ITEM_OVERHEAD:
            raise TwoServerError(
                f"client {client}'s upload of {n} bytes cannot be relayed to S1 (message limit "
                f"{MAX_MESSAGE_BYTES} bytes): the round's domain or width is too large"
            )
        if chunk and (size + n > max_bytes or len(chunk) >= MAX_ITEMS):
            yield chunk
            chunk, size = [], 0
        chunk.append((client, upload))
        size += n
    if chunk:
        yield chunk
