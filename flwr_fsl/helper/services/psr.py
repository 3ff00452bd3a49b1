"""S1's private submodel retrieval service (Cui et al. 2023, §4.2), on a round SSA opened.

``SetModel`` gives S1 the round's table (public to both servers by design: it is the global
model); ``PsrAnswer`` relays each client's public part and its sealed ``(master seed, hash,
per-query answer key)``; S1 answers with :class:`~flwr_fsl.families.ssa.psr.PSRServer` and seals
each answer to the client's per-query key under the round's binding (session, round, parameter
digest), so S0 cannot combine it with its own answer. A client may query once per round; a
malformed or replayed query is rejected for that client only.

**Threat model and leakage.** S1 learns the table, each client's public part and S1 master seed
(pseudorandom by DPF security) and which clients queried; not which rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.families.ssa import sealing as ssa_sealing
from flwr_fsl.families.ssa.psr import PSRServer
from flwr_fsl.helper import wire
from flwr_fsl.helper.errors import HelperRequestError
from flwr_fsl.helper.service import PARTY, Method, Session
from flwr_fsl.helper.services.ssa import SSARound, budget, claim, client_result, log_results

if TYPE_CHECKING:
    from flwr_fsl.helper.service import HelperService

__all__ = ["PSRService"]

_TABLE = "psr.table"
_QUERIED = "psr.queried"


class PSRService:
    """The PSR service (see the module docstring); registered by default.

    Parameters
    ----------
    host : HelperService
        The host, for S1's key pair.
    """

    name = "psr"

    def __init__(self, host: HelperService) -> None:
        self.host = host

    def methods(self) -> Mapping[str, Method]:
        """Return ``SetModel`` and ``PsrAnswer``."""
        return {
            "SetModel": Method(wire.SetModelRequest, self._set_model),
            "PsrAnswer": Method(wire.PsrAnswerRequest, self._psr_answer),
        }

    def _set_model(self, session: Session | None, message: wire.SetModelRequest) -> wire.Message:
        assert session is not None
        state: SSARound = session.round(message.round_id)
        if _TABLE in state.extras:
            raise HelperRequestError(f"round {message.round_id} already has a PSR table")
        shape = (state.params.domain_size, state.params.value_width)
        if message.table.shape != shape:  # before charging: the error names the real problem
            raise HelperRequestError(f"bad PSR table: shape {message.table.shape}, need {shape}")
        account = budget(state)
        before = account.memory
        account.add_table()
        rid = message.round_id
        try:  # S1's memory budget, before the table is kept
            session.charge(("round", rid), account.memory, f"round {rid}'s PSR table")
        except HelperRequestError:
            account.memory = before
            raise
        try:
            state.extras[_TABLE] = PSRServer(state.params, PARTY, message.table)
        except ValueError as err:
            account.memory = before
            session.charge(("round", rid), before, "", check=False)
            raise HelperRequestError(f"bad PSR table: {err}") from None
        state.extras[_QUERIED] = set()
        return wire.OkResponse()

    def _psr_answer(self, session: Session | None, message: wire.PsrAnswerRequest) -> wire.Message:
        assert session is not None
        rid = message.round_id
        state: SSARound = session.round(rid)
        psr = state.extras.get(_TABLE)
        if not isinstance(psr, PSRServer):
            raise HelperRequestError(f"round {rid} has no PSR table (call SetModel first)")
        ids = (item.client_id for item in message.queries)
        budget(state).admit("PsrAnswer", state.extras[_QUERIED], ids, query=True)
        results = []
        for item in message.queries:
            reason = claim(state.extras[_QUERIED], item.client_id, rid)
            payload = b""
            if reason is None:
                try:
                    seed, answer_key = ssa_sealing.open_psr_query(
                        self.host.keypair,
                        item.sealed,
                        binding=state.binding,
                        client_id=item.client_id,
                        public_part=item.public_part,
                    )
                    answer = psr.answer(item.public_part, seed)
                    payload = ssa_sealing.seal_psr_answer(
                        answer_key, answer, binding=state.binding, client_id=item.client_id
                    )
                except ClientInputError as err:
                    reason = f"{type(err).__name__}: {err}"
            results.append(client_result(item.client_id, reason, payload))
        log_results("PsrAnswer", rid, results)
        return wire.ClientResultsResponse(tuple(results))
