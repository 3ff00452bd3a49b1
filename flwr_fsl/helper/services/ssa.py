"""S1's two-server secure submodel aggregation service (Cui et al. 2023, Fig. 4), per session.

Per round, S0 relays to S1 (every request carries the run's session id):

1. ``OpenRound``: the round's public :class:`~flwr_fsl.families.ssa.protocol.SSAParams` (in a
   session ``OpenSession`` created; an unknown session is refused with
   :class:`~flwr_fsl.helper.errors.HelperSessionLostError`). A checked round is opened with
   ``OpenCheckedRound`` instead, which adds the round's secret digest key (16 bytes, drawn by
   S0; :mod:`flwr_fsl.families.ssa.verify`, digest version 3); a missing, all-zero or
   wrong-length key, or a key for an unchecked round, is refused and opens nothing. A checked
   round opened with plain ``OpenRound`` (an older S0) uses digest version 2 (SHA-256).
2. ``AddClients`` (and ``AddClientHints`` in U-DPF rounds): each client's public part and its
   sealed ``(master seed, SHA-256(public part))``, bound to the session, the round and the
   SHA-256 of the parameters S1 opened the round with; S1 opens it, checks the hash and
   evaluates the keys into its :class:`~flwr_fsl.families.ssa.protocol.SSAServer` share.
3. ``FinishRound``: S1's additive share of the aggregate and the ids of the clients in it (S0
   must aggregate exactly the same clients), or ``AbortRound``. In a DP round
   (:mod:`flwr_fsl.families.ssa.dp`) S1 first spends the round on its own account of the run
   (:mod:`flwr_fsl.helper.accounts`: per run id, on disk, refused past the run's budget or
   S1's ceiling — checked already at ``OpenRound``), then adds its own Gaussian noise to the
   share with the round's multiplier (never below S1's ``--dp-noise-multiplier``:
   :meth:`~flwr_fsl.helper.limits.HelperLimits.noise_multiplier` refuses such a round) and
   logs the run's ``(ε, δ)``: the guarantee against S0.

**Client identities** (:mod:`flwr_fsl.crypto.identity`): every upload and hint binding is
signed inside its sealed plaintext by the client's Ed25519 key. S1 refuses, per client, an
unsigned (v1) or badly signed one, a signer not on its enrollment list
(``HelperService.enrollment``), a signer already accepted in this round under any client id
(one contribution per enrolled client), and a hint whose signer is not the one that signed the
U-DPF keys S1 holds for that client id. S1's minimum participation
(:meth:`~flwr_fsl.helper.limits.HelperLimits.check_participation`) counts the round's distinct
accepted signers: S0 cannot reach it with invented clients.

**Per-client privacy accounts** (:mod:`flwr_fsl.helper.client_accounts`): every DP round S1
returns a share of is also spent on each accepted signer's own account, across runs and
sessions; with S1's per-client ceiling (``--dp-client-budget-epsilon``) a client whose account
the round would take past it is refused per client at ``AddClients`` / ``AddClientHints``. A
fresh Flower run therefore resets no client's budget at S1.

**Checked rounds** (``SSAParams.verify``, the default; :mod:`flwr_fsl.families.ssa.verify`):
S0 relays with ``AddCheckedClients`` / ``AddCheckedHints`` instead, each item carrying S0's
key-check digest; S1 evaluates, adds the client only if its own digest is equal, and answers
its digest (S0 drops a client whose S1 digest differs). S1 refuses ``AddClients`` and
``AddClientHints`` in such a round, so S0 cannot skip the check on S1's side.

**Per-client failures never fail a round**: a sealed blob that does not open (tampered, from
another session, round, parameter set or client, wrong key), a public part whose hash differs
(altered by S0), malformed keys, a stale hint or a client id already submitted in the round
(duplicate or replay) is reported for that client only and leaves S1's share unchanged.

**U-DPF** (Cui §5): the session keeps every client's latest DPF key batch across rounds (client id
-> keys and the signer of the keys, replaced when the client contributes again), one store per
hashing layout (:func:`~flwr_fsl.families.ssa.protocol.layout_key`: a mixed round's tables each
have their own) and at most ``--max-open-rounds`` layouts per session, the least recently used
dropped first; it hands a round's layout's keys to its ``SSAServer`` as ``previous_keys``. A
hint comes with the client's binding sealed to S1 (the hint's SHA-256 and the digest of the keys
it updates, :func:`~flwr_fsl.crypto.ssa_sealing.seal_udpf_hint`): S1 refuses a
hint S0 altered or one made for keys other than those S1 holds for the client. Keys live only in
memory, in the session: a restarted S1 holds no session, refuses the old one's calls (S0 then
forgets its own stored keys, so clients send fresh keys), and a hint for keys it does not hold is
rejected for that client.

**Threat model and leakage.** Two non-colluding servers. S0 relays but cannot read or alter S1's
material, and (with an enrollment list) cannot invent a client S1 counts or reuse one client's
signed material under another id (``tests/attacks/test_helper_sybil.py``). S1 learns the public
parameters, each client's public part and S1 master seed (pseudorandom and independent of the
client's indices and values by DPF security), which client ids and enrolled signers took part, and
its own share of the aggregate — an additive share, uniformly random on its own.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.privacy import PrivacyAccount
from flwr_fsl.core.threads import pipelined, streamed
from flwr_fsl.crypto import sealing
from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.families.ssa import sealing as ssa_sealing
from flwr_fsl.families.ssa.dp import noise_std, noise_words
from flwr_fsl.families.ssa.protocol import (
    ClientKeys,
    PreparedKeys,
    SSAInputError,
    SSAParams,
    SSAServer,
    held_digest,
    layout_key,
)
from flwr_fsl.families.ssa.server_eval import StartedClient
from flwr_fsl.families.ssa.verify import check_digest_key
from flwr_fsl.helper import wire
from flwr_fsl.helper.errors import HelperRequestError
from flwr_fsl.helper.limits import RoundBudget
from flwr_fsl.helper.quota import key_bytes
from flwr_fsl.helper.service import PARTY, Method, Session

if TYPE_CHECKING:
    from flwr_fsl.helper.service import HelperService

_Ready = tuple[ssa_sealing.OpenedUpload, PreparedKeys | Exception]
_Row = tuple[int, bytes, bytes, bytes | None]  # client, public part, sealed seed, S0's digest
_Add = Callable[[ClientKeys, PreparedKeys | Exception], bytes | None]
_Started = tuple[_Ready | Exception, StartedClient | Exception | None]
"""A fresh upload opened and decoded ahead (or the error decoding raised)."""

__all__ = [
    "BUDGET",
    "SSARound",
    "SSAService",
    "SignerRefusedError",
    "budget",
    "charge_keys",
    "client_result",
    "log_results",
]

log = logging.getLogger("flwr_fsl.helper")

STORED_KEYS = ("stored-keys",)
"""The memory charge of the U-DPF keys a session keeps across rounds."""
BUDGET = "helper.budget"
"""``SSARound.extras`` key of the round's :class:`~flwr_fsl.helper.limits.RoundBudget`."""


class SignerRefusedError(ClientInputError):
    """S1 refuses a client's verified signer: unknown, reused in the round, or not the holder's."""


@dataclass
class SSARound:
    """One open round of a session: parameters, S1's share under construction, who submitted.

    ``extras`` holds other services' per-round state (e.g. the PSR table).
    """

    params: SSAParams
    binding: sealing.RoundBinding
    ssa: SSAServer
    submitted: set[int] = field(default_factory=set)
    extras: dict[str, Any] = field(default_factory=dict)
    signers: dict[bytes, int] = field(default_factory=dict)
    """Signer public key -> the client id it was accepted under in this round."""


@dataclass
class _StoredKeys:
    keys: dict[int, DPFKeyBatch] = field(default_factory=dict)
    layout: SSAParams | None = None
    signers: dict[int, bytes] = field(default_factory=dict)  # client id -> signer of its keys


_Stores = dict[tuple[object, ...], _StoredKeys]  # layout -> its keys, least recently used first


def budget(state: SSARound) -> RoundBudget:
    """Return the round's account against S1's limits (set by ``OpenRound``)."""
    account: RoundBudget = state.extras[BUDGET]
    return account


def claim(seen: set[int], client_id: int, rid: int) -> str | None:
    """Mark a client as having submitted; return a reason if it already did."""
    if client_id in seen:
        return f"client {client_id} already submitted in round {rid} (duplicate or replay)"
    seen.add(client_id)
    return None


def client_result(client_id: int, reason: str | None, payload: bytes = b"") -> wire.ClientResult:
    """Build one client's outcome (ok with ``payload``, or rejected with ``reason``)."""
    if reason is None:
        return wire.ClientResult(client_id, True, payload)
    return wire.ClientResult(client_id, False, reason.encode("utf-8"))


def log_results(method: str, rid: int, results: list[wire.ClientResult]) -> None:
    """Log how many clients a call accepted and why the others were rejected."""
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


class SSAService:
    """The SSA service (see the module docstring); registered by default.

    Parameters
    ----------
    host : HelperService
        The host, for S1's key pair and the per-session round limit.
    """

    name = "ssa"

    def __init__(self, host: HelperService) -> None:
        self.host = host

    def methods(self) -> Mapping[str, Method]:
        """Return the round methods (open, add clients or hints, finish, abort)."""
        return {
            "OpenRound": Method(wire.OpenRoundRequest, self._open_round),
            "OpenCheckedRound": Method(wire.OpenCheckedRoundRequest, self._open_round),
            "AddClients": Method(wire.AddClientsRequest, self._add_clients),
            "AddClientHints": Method(wire.AddHintsRequest, self._add_hints),
            "AddCheckedClients": Method(wire.AddCheckedRequest, self._add_checked),
            "AddCheckedHints": Method(wire.AddCheckedHintsRequest, self._add_checked),
            "FinishRound": Method(wire.FinishRoundRequest, self._finish_round),
            "AbortRound": Method(wire.AbortRoundRequest, self._abort_round),
        }

    @staticmethod
    def _stores(session: Session) -> _Stores:
        stores: _Stores = session.data.setdefault("ssa", {})
        return stores

    def _stored(self, session: Session, params: SSAParams) -> _StoredKeys:
        """Return the stored U-DPF keys of ``params``' layout (empty if none)."""
        return self._stores(session).get(layout_key(params), _StoredKeys())

    def _open_round(self, session: Session | None, message: wire.OpenRoundRequest) -> wire.Message:
        assert session is not None
        rid = message.round_id
        if rid in session.rounds or rid in session.closed:
            raise HelperRequestError(f"round {rid} was already opened in this session (replay?)")
        if len(session.rounds) >= self.host.max_open_rounds:
            raise HelperRequestError(
                f"{len(session.rounds)} rounds are open (limit {self.host.max_open_rounds}): "
                f"finish or abort one of {sorted(session.rounds)}"
            )
        self.host.limits.check_params_bytes(len(message.params))
        try:
            params = SSAParams.from_bytes(message.params)
            if params.round_id != rid:
                raise HelperRequestError(f"parameters are for round {params.round_id}, not {rid}")
            account = self.host.limits.open_round(params)  # before anything is allocated
        except HelperRequestError:
            raise
        except (ValueError, TypeError, ArithmeticError) as err:
            # The decoder names the field; a value that only fails S1's own arithmetic (noise,
            # memory) is still the caller's bad parameter, never an internal error.
            raise HelperRequestError(f"bad round parameters: {err}") from None
        key = _digest_key(params, message)
        if account.noise_multiplier is not None:
            # Refused here, before any client is asked anything, if the run's account is out.
            self.host.accounts.check(params, session.session_id, account.noise_multiplier)
        # S1's memory budget, before the share and hashing table are allocated.
        session.charge(("round", rid), account.memory, f"round {rid}")
        stored = self._stored(session, params)
        binding = sealing.RoundBinding.of(session.session_id, rid, message.params)
        try:
            ssa = SSAServer(params, PARTY, previous_keys=stored.keys, digest_key=key)
        except BaseException:
            session.release(("round", rid))
            raise
        session.rounds[rid] = SSARound(params, binding, ssa, extras={BUDGET: account})
        log.info("round %d opened (m=%d, k=%d)", rid, params.domain_size, params.num_items)
        return wire.OkResponse()

    def _add_clients(
        self, session: Session | None, message: wire.AddClientsRequest
    ) -> wire.Message:
        assert session is not None
        rid = message.round_id
        state: SSARound = session.round(rid)
        _refuse_unchecked(state, "AddClients")
        ids = [item.client_id for item in message.uploads]
        budget(state).admit("AddClients", state.submitted, ids, query=False)
        charge_keys(session, state, ids)
        rows = [(i.client_id, i.public_part, i.sealed, None) for i in message.uploads]
        results = [
            client_result(row[0], reason)
            for row, (reason, _) in zip(rows, self._add_uploads(state, rows), strict=True)
        ]
        log_results("AddClients", rid, results)
        return wire.ClientResultsResponse(tuple(results))

    def _add_uploads(
        self, state: SSARound, rows: Sequence[_Row]
    ) -> list[tuple[str | None, bytes | None]]:
        """Add clients' fresh keys in order; return each one's ``(reason refused, digest)``.

        Each row is ``(client, public part, sealed seed, S0's digest or None)``. A client is
        claimed (one submission per round), its sealed seed opened, its signer checked and its
        keys added (checked against S0's digest ``expect`` in a checked round), in that order;
        a client that fails is refused alone with the reason. Opening a client's seal (which
        hashes its public part) and decoding its keys read no round state, so the next
        client's run on S1's threads while this one is evaluated
        (:func:`~flwr_fsl.core.threads.pipelined`, :meth:`SSAServer.prepare`); where the
        round :attr:`~SSAServer.streams`, the next client's keys are also evaluated while this
        one is settled (:meth:`_stream_uploads`).
        """

        def prepare(row: _Row) -> _Ready:
            return self._open_upload(state, row)

        def use(row: _Row, ready: _Ready | Exception) -> tuple[str | None, bytes | None]:
            return self._settle_upload(state, row, ready, state.ssa.add_prepared)

        if state.ssa.streams:
            return self._stream_uploads(state, rows)
        return pipelined(rows, prepare, use, state.ssa.threads)

    def _open_upload(self, state: SSARound, row: _Row) -> _Ready:
        """Open a client's sealed seed and decode its keys (a refusal: the keys' exception)."""
        client, public, sealed, _ = row
        opened = ssa_sealing.open_ssa_upload(
            self.host.keypair,
            sealed,
            binding=state.binding,
            client_id=client,
            public_part=public,
        )
        try:
            keys: PreparedKeys | Exception = state.ssa.prepare(
                ClientKeys(client, public, opened.master_seed)
            )
        except Exception as err:  # raised in order, by add_prepared
            keys = err
        return opened, keys

    def _settle_upload(
        self, state: SSARound, row: _Row, ready: _Ready | Exception, add: _Add
    ) -> tuple[str | None, bytes | None]:
        """Claim a client, check its opened seal and signer, then ``add`` its keys."""
        client, public, _, expect = row
        reason = claim(state.submitted, client, state.params.round_id)
        if reason is not None:
            return reason, None
        try:
            if isinstance(ready, Exception):
                raise ready  # the seal did not open
            opened, keys = ready
            refused = self._signer_refused(state, client, opened.signer)
            if refused is not None:
                raise SignerRefusedError(refused)
            digest = add(ClientKeys(client, public, opened.master_seed, expect), keys)
        except SignerRefusedError as err:
            return str(err), None
        except ClientInputError as err:
            return f"{type(err).__name__}: {err}", None
        state.signers[opened.signer] = client
        return None, digest

    def _stream_uploads(
        self, state: SSARound, rows: Sequence[_Row]
    ) -> list[tuple[str | None, bytes | None]]:
        """:meth:`_add_uploads` streamed (:func:`~flwr_fsl.core.threads.streamed`).

        The next client's keys are evaluated while this one is claimed, its signer checked and
        its keys settled (:meth:`SSAServer.settle`), in the same order; keys started for a
        client that is refused before they are settled are taken back out
        (:meth:`SSAServer.cancel`).
        """

        def start(row: _Row, ready: _Ready | Exception) -> _Started:
            client, public, _, expect = row
            if isinstance(ready, Exception) or client in state.submitted:
                return ready, None  # refused by _settle_upload, in order: nothing to evaluate
            opened, keys = ready
            item = ClientKeys(client, public, opened.master_seed, expect)
            return ready, state.ssa.start(item, keys)

        def finish(row: _Row, started: _Started) -> tuple[str | None, bytes | None]:
            held = [started[1]]

            def settle(item: ClientKeys, _: PreparedKeys | Exception) -> bytes | None:
                begun, held[0] = held[0], None
                assert begun is not None  # started for every client that gets this far
                return state.ssa.settle(item, begun)

            try:
                return self._settle_upload(state, row, started[0], settle)
            finally:
                if held[0] is not None:  # refused before its keys were settled
                    state.ssa.cancel(held[0])

        def cancel(_: _Row, started: _Started) -> None:
            if started[1] is not None:
                state.ssa.cancel(started[1])

        def prepare(row: _Row) -> _Ready:
            return self._open_upload(state, row)

        return streamed(rows, prepare, start, finish, cancel, state.ssa.threads)

    def _add_hint(
        self,
        session: Session,
        state: SSARound,
        client: int,
        hint: bytes,
        sealed: bytes,
        expect: bytes | None = None,
    ) -> bytes | None:
        """Open one client's sealed hint binding, check its signer and apply its hint.

        The updated keys are checked against S0's digest ``expect`` in a checked round.

        Raises
        ------
        ClientInputError
            If the binding does not open or is stale, its signer is refused
            (:class:`SignerRefusedError`) or the hint is malformed or fails the key check.
        """
        opened = ssa_sealing.open_udpf_hint(
            self.host.keypair, sealed, binding=state.binding, client_id=client, hint=hint
        )
        stored = self._stored(session, state.params)
        mine = stored.keys.get(client)
        if mine is None or not hmac.compare_digest(opened.held, held_digest(mine)):
            # S1's own check: never apply a hint to keys it was not made for.
            raise SSAInputError("stale hint: S1 holds other keys for this client")
        reason = self._signer_refused(state, client, opened.signer, stored.signers.get(client))
        if reason is not None:
            raise SignerRefusedError(reason)
        digest = state.ssa.add_client_hint(client, hint, expect)
        state.signers[opened.signer] = client
        return digest

    def _add_checked(
        self, session: Session | None, message: wire.AddCheckedRequest
    ) -> wire.Message:
        """Add a checked round's uploads or hints, each with S0's key-check digest.

        S1 evaluates each client's keys, compares its own digest with S0's and adds the client
        only if they are equal; an accepted client's result carries S1's digest (S0 drops any
        client whose S1 digest differs from its own), a rejected one the reason.
        """
        assert session is not None
        rid = message.round_id
        state: SSARound = session.round(rid)
        name = (
            "AddCheckedHints"
            if isinstance(message, wire.AddCheckedHintsRequest)
            else ("AddCheckedClients")
        )
        if not state.params.verify:
            raise HelperRequestError(f"round {rid} does not check keys: use AddClients")
        ids = [item.client_id for item in message.items]
        budget(state).admit(name, state.submitted, ids, query=False)
        charge_keys(session, state, ids)
        if name == "AddCheckedClients":
            rows = [(i.client_id, i.body, i.sealed, i.digest) for i in message.items]
            results = [
                client_result(row[0], reason, digest or b"")
                for row, (reason, digest) in zip(rows, self._add_uploads(state, rows), strict=True)
            ]
            log_results(name, rid, results)
            return wire.ClientResultsResponse(tuple(results))
        results = []
        for item in message.items:
            reason = claim(state.submitted, item.client_id, rid)
            digest: bytes | None = None
            if reason is None:
                try:
                    digest = self._add_hint(
                        session, state, item.client_id, item.body, item.sealed, item.digest
                    )
                except SignerRefusedError as err:
                    reason = str(err)
                except ClientInputError as err:
                    reason = f"{type(err).__name__}: {err}"
            results.append(client_result(item.client_id, reason, digest or b""))
        log_results(name, rid, results)
        return wire.ClientResultsResponse(tuple(results))

    def _add_hints(self, session: Session | None, message: wire.AddHintsRequest) -> wire.Message:
        assert session is not None
        rid = message.round_id
        state: SSARound = session.round(rid)
        _refuse_unchecked(state, "AddClientHints")
        ids = [item.client_id for item in message.hints]
        budget(state).admit("AddClientHints", state.submitted, ids, query=False)
        charge_keys(session, state, ids)
        results = []
        for item in message.hints:
            reason = claim(state.submitted, item.client_id, rid)
            if reason is None:
                try:
                    self._add_hint(session, state, item.client_id, item.hint, item.sealed)
                except SignerRefusedError as err:
                    reason = str(err)
                except ClientInputError as err:
                    reason = f"{type(err).__name__}: {err}"
            results.append(client_result(item.client_id, reason))
        log_results("AddClientHints", rid, results)
        return wire.ClientResultsResponse(tuple(results))

    def _signer_refused(
        self, state: SSARound, client_id: int, signer: bytes, holder: bytes | None = None
    ) -> str | None:
        """Return why S1 refuses a (verified) signer for ``client_id``, or None.

        ``holder`` is the signer of the U-DPF keys S1 holds for the client (hints only).
        """
        reason = self.host.enrollment.check(signer)
        if reason is not None:
            return reason
        other = state.signers.get(signer)
        if other is not None:
            return (
                f"signer {signer.hex()[:16]}... already signed for client {other} in round "
                f"{state.params.round_id} (one contribution per enrolled client)"
            )
        if holder is not None and not hmac.compare_digest(holder, signer):
            return (
                f"signer {signer.hex()[:16]}... is not the one that signed the U-DPF keys S1 "
                f"holds for client {client_id}"
            )
        z = budget(state).noise_multiplier
        if z is not None:  # a DP round: the client's own account across runs
            return self.host.client_accounts.refusal(signer, z)
        return None

    def _finish_round(
        self, session: Session | None, message: wire.FinishRoundRequest
    ) -> wire.Message:
        assert session is not None
        rid = message.round_id
        state: SSARound = session.round(rid)
        clients = tuple(sorted(state.ssa.clients))
        signers = len(set(state.signers))  # distinct accepted (enrolled) signers
        try:
            self.host.limits.check_participation(rid, min(signers, len(clients)))
        except HelperRequestError:
            # Too few clients: S1 drops the round (and its keys) rather than help isolate one.
            session.close_round(rid)
            log.warning("round %d refused: %d enrolled signers is below the minimum", rid, signers)
            raise
        share = state.ssa.share()
        z = budget(state).noise_multiplier
        if z is not None and clients:
            self._check_clients(session, state, z)  # before the run's account is touched
            try:
                spent = self.host.accounts.spend(state.params, session.session_id, z)
            except HelperRequestError:
                session.close_round(rid)  # the run is out of budget: S1 releases nothing
                log.warning("round %d refused: the run's privacy budget is spent", rid)
                raise
            self.host.client_accounts.spend(state.signers, z)
            self._add_noise(state, share, z, spent)
        if state.ssa.keeps_keys:
            self._store_keys(session, state)
        session.close_round(rid)
        log.info("round %d finished with %d clients", rid, len(clients))
        return wire.ShareResponse(clients, share)

    def _store_keys(self, session: Session, state: SSARound) -> None:
        """Keep a finished U-DPF round's keys in its layout's store (bounded per session)."""
        stores = self._stores(session)
        stored = stores.pop(layout_key(state.params), _StoredKeys())
        stored.keys.update(state.ssa.keys)
        stored.signers.update((cid, signer) for signer, cid in state.signers.items())
        stored.layout = state.params
        stores[layout_key(state.params)] = stored  # most recently used last
        while len(stores) > self.host.max_open_rounds:
            del stores[next(iter(stores))]
        held = sum(len(s.keys) * key_bytes(s.layout) for s in stores.values() if s.layout)
        # Moved from the round's charge (already allocated): recorded, never refused.
        session.charge(STORED_KEYS, held, "", check=False)

    def _check_clients(self, session: Session, state: SSARound, z: float) -> None:
        """Refuse the round if an accepted client's own account can no longer take it.

        A client admitted at ``AddClients`` may have gone past S1's per-client ceiling since
        (in another session); then nothing is spent and no share is returned.

        Raises
        ------
        HelperRequestError
            If a client's account would now exceed the ceiling (the round is dropped).
        """
        accounts = self.host.client_accounts
        late = [r for r in (accounts.refusal(k, z) for k in state.signers) if r is not None]
        if late:
            session.close_round(state.params.round_id)
            raise HelperRequestError(f"round {state.params.round_id} refused: {late[0]}")

    def _add_noise(
        self, state: SSARound, share: NDArray[np.uint64], z: float, account: PrivacyAccount
    ) -> None:
        """Add S1's DP noise to ``share`` in place and log the run's (ε, δ) (already spent)."""
        p = state.params
        assert p.dp is not None  # noise_multiplier is None for rounds without DP
        sigma = noise_std(p.dp, p.num_items, p.value_width, p.frac_bits, z)
        share += noise_words(share.shape, sigma, p.fixed_point)
        run = "its session" if p.run is None else f"run {p.run.run_id}"
        log.info(
            "round %d: S1 added DP noise (noise multiplier %.4g, std %.4g per word); "
            "S1's account of %s against S0: %s",
            p.round_id,
            z,
            sigma,
            run,
            account.describe(),
        )

    def _abort_round(
        self, session: Session | None, message: wire.AbortRoundRequest
    ) -> wire.Message:
        assert session is not None
        session.round(message.round_id)
        session.close_round(message.round_id)
        log.warning("round %d aborted", message.round_id)
        return wire.OkResponse()


def charge_keys(session: Session, state: SSARound, client_ids: list[int]) -> None:
    """Charge the U-DPF keys a request's new clients leave on S1, before evaluating any.

    One-shot rounds (epoch 0) free each client's keys once evaluated: nothing is charged.

    Raises
    ------
    HelperResourceError
        If the session or S1 would exceed its memory limit (nothing charged).
    """
    if state.params.epoch < 1:
        return
    clients = len(state.submitted | set(client_ids))
    rid = state.params.round_id
    session.charge(
        ("round-keys", rid),
        clients * key_bytes(state.params),
        f"the U-DPF keys of round {rid}'s {clients} clients",
    )


def _digest_key(params: SSAParams, message: wire.OpenRoundRequest) -> bytes | None:
    """Return the round's digest key (``OpenCheckedRound``), or None (``OpenRound``: version 2).

    Raises
    ------
    HelperRequestError
        If a key comes with a round that does not check keys, or is not a usable key.
    """
    if not isinstance(message, wire.OpenCheckedRoundRequest):
        return None
    if not params.verify:
        raise HelperRequestError(
            f"round {params.round_id} does not check keys: a digest key is for checked rounds"
        )
    try:
        return check_digest_key(message.digest_key)
    except ConfigurationError as err:
        raise HelperRequestError(f"bad digest key: {err}") from None


def _refuse_unchecked(state: SSARound, method: str) -> None:
    """Refuse an unchecked upload call in a round that checks every client's keys.

    Raises
    ------
    HelperRequestError
        If the round's parameters carry ``verify`` (S0 must relay its digests).
    """
    if state.params.verify:
        raise HelperRequestError(
            f"round {state.params.round_id} checks every client's keys: {method} without "
            "S0's key-check digests is refused (use AddCheckedClients / AddCheckedHints)"
        )
