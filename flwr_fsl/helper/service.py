"""The helper server S1's logic: bytes in, bytes out, shared by the gRPC server and the twin.

S1 is the second, non-colluding server of Cui et al. (2023). Per round, S0 (the Flower
ServerApp) relays to it:

1. ``OpenRound``: the round's public :class:`~flwr_fsl.protocols.ssa.SSAParams`.
2. optionally ``SetModel`` + ``PsrAnswer`` (private submodel retrieval): the table to answer
   from, then each client's public part and sealed ``(master seed, hash, answer key)``; S1
   answers with :class:`~flwr_fsl.protocols.psr.PSRServer` and seals each answer to the
   client's per-query key, so S0 cannot combine it with its own answer.
3. ``AddClients`` (and ``AddClientHints`` in U-DPF rounds): each client's public part and its
   sealed ``(master seed, SHA-256(public part))``; S1 opens it, checks the hash and evaluates
   the keys into its :class:`~flwr_fsl.protocols.ssa.SSAServer` share.
4. ``FinishRound``: S1's additive share of the aggregate and the ids of the clients in it (S0
   must aggregate exactly the same clients), or ``AbortRound``.

Every request and response is a :mod:`flwr_fsl.helper.wire` message; :meth:`HelperService.handle`
is the one entry point, so the gRPC server (:mod:`flwr_fsl.helper.server`) and the in-process
twin (:class:`~flwr_fsl.helper.connection.InProcessHelper`) run byte-identical code paths.

**Per-client failures never fail a round**: a sealed blob that does not open (tampered,
replayed from another round or client, wrong key), a public part whose hash differs (altered
by S0), malformed keys, a stale hint or a client id already submitted in the round (duplicate
or replay) is reported for that client only and leaves S1's share unchanged. A malformed
request, an unknown, finished or duplicate round, or a call in the wrong state raises
:class:`~flwr_fsl.helper.errors.HelperRequestError` for the whole call.

**U-DPF** (Cui §5): S1 keeps every client's latest DPF key batch across rounds (client id ->
keys, replaced when the client contributes again, dropped when a round with another hashing
layout opens) and hands them to the next round's ``SSAServer`` as ``previous_keys``. Memory is
bounded by the number of distinct clients times one key batch.

**Threat model and leakage.** Two non-colluding semi-honest servers. S0 relays but cannot read
or alter S1's material (HPKE AEAD with round/client/purpose bound as associated data, plus the
public-part hash). S1 learns the public parameters, each client's public part and S1 master
seed (pseudorandom and independent of the client's indices and values by DPF security), which
client ids took part, the PSR table (public to both servers by design), and its own share of
the aggregate — an additive share, uniformly random on its own. Its answers and shares reveal
nothing to S0 beyond the reconstructed aggregate. The S0–S1 link carries only shares and public
data; enable TLS and the access token (:mod:`flwr_fsl.helper.server`) or keep it on a private
network.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair
from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.helper import sealing, wire
from flwr_fsl.helper.errors import HelperRequestError, WireFormatError
from flwr_fsl.protocols.psr import PSRServer
from flwr_fsl.protocols.ssa import SSAParams, SSAServer, same_layout

__all__ = ["METHODS", "PARTY", "SERVICE_NAME", "HelperService"]

SERVICE_NAME = "flwr_fsl.helper.v1.Helper"
"""Fully qualified gRPC service name."""
PARTY = 1
"""S1 is party 1 of every two-party protocol."""
METHODS: dict[str, type[wire.Message]] = {
    "Health": wire.HealthRequest,
    "PublicKey": wire.PublicKeyRequest,
    "OpenRound": wire.OpenRoundRequest,
    "AddClients": wire.AddClientsRequest,
    "AddClientHints": wire.AddHintsRequest,
    "FinishRound": wire.FinishRoundRequest,
    "AbortRound": wire.AbortRoundRequest,
    "SetModel": wire.SetModelRequest,
    "PsrAnswer": wire.PsrAnswerRequest,
}
"""gRPC method name -> request message type."""

_LOCK_FREE = frozenset({"Health", "PublicKey"})  # answer even while a long call holds the lock
log = logging.getLogger("flwr_fsl.helper")


@dataclass
class _Round:
    params: SSAParams
    ssa: SSAServer
    submitted: set[int] = field(default_factory=set)
    psr: PSRServer | None = None
    queried: set[int] = field(default_factory=set)


class HelperService:
    """S1's state and request handling (thread-safe).

    One lock serializes every state-changing call; ``Health`` and ``PublicKey`` do not wait
    for it, so a health check answers while a long ``AddClients`` runs.

    Parameters
    ----------
    keypair : SealingKeyPair
        S1's X25519 key pair (clients seal to its public key).
    max_open_rounds : int (default: 4)
        Rounds that may be open at once; opening more is refused (abort stale ones).

    Raises
    ------
    ValueError
        If ``max_open_rounds`` is < 1 or ``keypair`` is not a :class:`SealingKeyPair`.
    """

    def __init__(self, keypair: SealingKeyPair, *, max_open_rounds: int = 4) -> None:
        if not isinstance(keypair, SealingKeyPair):
            raise ValueError(f"keypair must be a SealingKeyPair, got {type(keypair).__name__}")
        if isinstance(max_open_rounds, bool) or not isinstance(max_open_rounds, int):
            raise ValueError("max_open_rounds must be an int")
        if max_open_rounds < 1:
            raise ValueError(f"max_open_rounds must be >= 1, got {max_open_rounds}")
        self.keypair = keypair
        self.max_open_rounds = max_open_rounds
        self._lock = threading.Lock()
        self._rounds: dict[int, _Round] = {}
        self._open_snapshot: tuple[int, ...] = ()  # read by the lock-free Health call
        self._closed: set[int] = set()
        self._stored_keys: dict[int, DPFKeyBatch] = {}
        self._stored_layout: SSAParams | None = None
        self._handlers: dict[str, Callable[[wire.Message], wire.Message]] = {
            "Health": self._health,
            "PublicKey": self._public_key,
            "OpenRound": self._open_round,
            "AddClients": self._add_clients,
            "AddClientHints": self._add_hints,
            "FinishRound": self._finish_round,
            "AbortRound": self._abort_round,
            "SetModel": self._set_model,
            "PsrAnswer": self._psr_answer,
        }

    @property
    def public_key(self) -> bytes:
        """S1's raw 32-byte X25519 public key."""
        return self.keypair.public_bytes

    @property
    def fingerprint(self) -> str:
        """Hex SHA-256 of :attr:`public_key` (what operators pin in the run config)."""
        return self.keypair.fingerprint

    def handle(self, method: str, request: bytes) -> bytes:
        """Run one call: decode the request, update state, encode the response.

        Parameters
        ----------
        method : str
            A key of :data:`METHODS` (the gRPC method name).
        request : bytes
            The wire-encoded request of that method.

        Returns
        -------
        bytes
            The wire-encoded response.

        Raises
        ------
        HelperRequestError
            If the method is unknown, the request is malformed (any
            :class:`~flwr_fsl.helper.errors.WireFormatError`) or refused in the current state.
        """
        expected = METHODS.get(method)
        if expected is None:
            raise HelperRequestError(f"unknown method {method!r}")
        try:
            message = wire.decode(request, expected)
        except WireFormatError as err:
            raise HelperRequestError(f"malformed {method} request: {err}") from None
        if method in _LOCK_FREE:
            response = self._handlers[method](message)
        else:
            with self._lock:
                response = self._handlers[method](message)
                self._open_snapshot = tuple(sorted(self._rounds))
        return wire.encode(response)

    # --------------------------------------------------------------------------------------------

    def _round(self, round_id: int) -> _Round:
        state = self._rounds.get(round_id)
        if state is None:
            what = "already finished or aborted" if round_id in self._closed else "not open"
            raise HelperRequestError(f"round {round_id} is {what}")
        return state

    def _health(self, _: wire.Message) -> wire.Message:
        return wire.HealthResponse(wire.VERSION, self.public_key, self._open_snapshot)

    def _public_key(self, _: wire.Message) -> wire.Message:
        return wire.PublicKeyResponse(self.public_key)

    def _open_round(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.OpenRoundRequest)
        rid = message.round_id
        if rid in self._rounds or rid in self._closed:
            raise HelperRequestError(f"round {rid} was already opened (replay?)")
        if len(self._rounds) >= self.max_open_rounds:
            raise HelperRequestError(
                f"{len(self._rounds)} rounds are open (limit {self.max_open_rounds}): "
                f"finish or abort one of {sorted(self._rounds)}"
            )
        try:
            params = SSAParams.from_bytes(message.params)
        except (ValueError, TypeError) as err:
            raise HelperRequestError(f"bad round parameters: {err}") from None
        if params.round_id != rid:
            raise HelperRequestError(f"parameters are for round {params.round_id}, not {rid}")
        if self._stored_layout is not None and not same_layout(self._stored_layout, params):
            self._stored_keys.clear()  # other hashing layout: stored U-DPF keys cannot apply
            self._stored_layout = None
        ssa = SSAServer(params, PARTY, previous_keys=self._stored_keys)
        self._rounds[rid] = _Round(params, ssa)
        log.info("round %d opened (m=%d, k=%d)", rid, params.domain_size, params.num_items)
        return wire.OkResponse()

    @staticmethod
    def _claim(seen: set[int], client_id: int, rid: int) -> str | None:
        if client_id in seen:
            return f"client {client_id} already submitted in round {rid} (duplicate or replay)"
        seen.add(client_id)
        return None

    def _add_clients(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.AddClientsRequest)
        rid = message.round_id
        state = self._round(rid)
        results = []
        for item in message.uploads:
            reason = self._claim(state.submitted, item.client_id, rid)
            if reason is None:
                try:
                    seed = sealing.open_ssa_upload(
                        self.keypair,
                        item.sealed,
                        round_id=rid,
                        client_id=item.client_id,
                        public_part=item.public_part,
                    )
                    state.ssa.add_client(item.client_id, item.public_part, seed)
                except (SealedBoxError, ValueError) as err:
                    reason = f"{type(err).__name__}: {err}"
            results.append(_result(item.client_id, reason))
        _log_results("AddClients", rid, results)
        return wire.ClientResultsResponse(tuple(results))

    def _add_hints(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.AddHintsRequest)
        rid = message.round_id
        state = self._round(rid)
        results = []
        for item in message.hints:
            reason = self._claim(state.submitted, item.client_id, rid)
            if reason is None:
                try:
                    state.ssa.add_client_hint(item.client_id, item.hint)
                except ValueError as err:
                    reason = f"{type(err).__name__}: {err}"
            results.append(_result(item.client_id, reason))
        _log_results("AddClientHints", rid, results)
        return wire.ClientResultsResponse(tuple(results))

    def _finish_round(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.FinishRoundRequest)
        rid = message.round_id
        state = self._round(rid)
        share = state.ssa.share()
        clients = tuple(sorted(state.ssa.keys))
        self._stored_keys.update(state.ssa.keys)
        self._stored_layout = state.params
        del self._rounds[rid]
        self._closed.add(rid)
        log.info("round %d finished with %d clients", rid, len(clients))
        return wire.ShareResponse(clients, share)

    def _abort_round(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.AbortRoundRequest)
        self._round(message.round_id)
        del self._rounds[message.round_id]
        self._closed.add(message.round_id)
        log.warning("round %d aborted", message.round_id)
        return wire.OkResponse()

    def _set_model(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.SetModelRequest)
        state = self._round(message.round_id)
        if state.psr is not None:
            raise HelperRequestError(f"round {message.round_id} already has a PSR table")
        try:
            state.psr = PSRServer(state.params, PARTY, message.table)
        except ValueError as err:
            raise HelperRequestError(f"bad PSR table: {err}") from None
        return wire.OkResponse()

    def _psr_answer(self, message: wire.Message) -> wire.Message:
        assert isinstance(message, wire.PsrAnswerRequest)
        rid = message.round_id
        state = self._round(rid)
        if state.psr is None:
            raise HelperRequestError(f"round {rid} has no PSR table (call SetModel first)")
        results = []
        for item in message.queries:
            reason = self._claim(state.queried, item.client_id, rid)
            payload = b""
            if reason is None:
                try:
                    seed, answer_key = sealing.open_psr_query(
                        self.keypair,
                        item.sealed,
                        round_id=rid,
                        client_id=item.client_id,
                        public_part=item.public_part,
                    )
                    answer = state.psr.answer(item.public_part, seed)
                    payload = sealing.seal_psr_answer(
                        answer_key, answer, round_id=rid, client_id=item.client_id
                    )
                except (SealedBoxError, ValueError) as err:
                    reason = f"{type(err).__name__}: {err}"
            results.append(_result(item.client_id, reason, payload))
        _log_results("PsrAnswer", rid, results)
        return wire.ClientResultsResponse(tuple(results))


def _result(client_id: int, reason: str | None, payload: bytes = b"") -> wire.ClientResult:
    if reason is None:
        return wire.ClientResult(client_id, True, payload)
    return wire.ClientResult(client_id, False, reason.encode("utf-8"))


def _log_results(method: str, rid: int, results: list[wire.ClientResult]) -> None:
    rejected = [r for r in results if not r.ok]
    log.info(
        "%s round %d: %d accepted, %d rejected",
        method,
        rid,
        len(results) - len(rejected),
        len(rejected),
    )
    for r in rejected:
        log.warning("%s round %d: client %d rejected: %s", method, rid, r.client_id, r.reason)
