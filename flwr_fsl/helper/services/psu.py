"""S1's side of Cui's basic protocol: the private set union's sum (``PsuSum``).

With ``SecureRowFedSubAvg(union="psu")`` every client splits its PSU vector (Niu's randomized
Bloom filter, exact mode by default: :mod:`flwr_fsl.families.ssa.union`) into S0's share,
``v - PRG(seed)``, and a 16-byte seed sealed to S1 under the round's PSU binding (session,
round, SHA-256 of the PSU parameters; :func:`~flwr_fsl.families.ssa.union.psu_binding`). S0
relays the sealed seeds in one ``PsuSum`` call; S1 opens each one, expands the stream with the
same PRG as :func:`~flwr_fsl.families.ssa.union.helper_vector`, sums them and returns its total
(one ``uint64`` vector) with a per-client outcome. Only the two totals' sum is ever opened (by
S0, which then announces the union to every client).

**Wire** (plugged-in kinds, :func:`~flwr_fsl.helper.wire.register_message`; the body of both
starts with its own format version ``u8`` = 1):

=====================  ==========================================================================
kind                   body
=====================  ==========================================================================
PSU_SUM (128)          version ``u8``, session, round ``u64``, PSU parameters ``bytes``
                       (:func:`~flwr_fsl.families.ssa.union.psu_params_to_bytes`, 46 bytes),
                       items (client ``u64``, sealed seed ``bytes``)
PSU_TOTAL (129)        version ``u8``, items (client ``u64``, status ``u8``, reason ``bytes``),
                       total ``array`` (uint64, 1-d, the PSU vector's length)
=====================  ==========================================================================

The decoder checks every length against the bytes left before it allocates; S1 then checks
the parameters (exact length, version, ranges), the vector length against its
``--max-domain`` (+ partitions) and the client count against ``--max-clients-per-round``, and
charges the total to the session's memory before allocating it. Each sealed seed must be
exactly ``16 + 56`` bytes. A round id may be summed once per session (a replay is refused);
within a call a client may appear once.

**Threat model and leakage.** S1 learns the PSU parameters, which clients sent a seed, and
nothing else from them (the seeds are uniform); its total is uniform-looking without S0's.
S0 learns S1's total, i.e. with its own the union (the option's documented leak).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer
from flwr_fsl.families.ssa.union import (
    UnionInputError,
    helper_vector,
    open_psu_seed,
    psu_binding,
    psu_params_from_bytes,
)
from flwr_fsl.helper import wire
from flwr_fsl.helper.errors import HelperError, HelperRequestError
from flwr_fsl.helper.service import Method, Session
from flwr_fsl.helper.services.ssa import client_result, log_results

if TYPE_CHECKING:
    from flwr_fsl.helper.service import HelperService

__all__ = ["PSUService", "PsuSumRequest", "PsuTotalResponse", "SeedItem", "request_psu_total"]

PSU_WIRE_VERSION = 1
_DATA = "psu.summed"  # session.data: round ids whose PSU S1 already summed


@dataclass(frozen=True)
class SeedItem:
    """One client's PSU seed sealed to S1."""

    client_id: int
    sealed: bytes = field(repr=False)


def _version(r: Reader) -> None:
    version = r.u8("PSU format version")
    if version != PSU_WIRE_VERSION:
        raise WireFormatError(f"unsupported PSU message version {version}")


@wire.register_message
@dataclass(frozen=True)
class PsuSumRequest(wire.Message):
    """Relay the round's sealed PSU seeds; S1 answers with its total."""

    KIND: ClassVar[int] = 128
    session: bytes
    round_id: int
    params: bytes = field(repr=False)
    seeds: tuple[SeedItem, ...]

    def _write(self, w: Writer) -> None:
        w.u8(PSU_WIRE_VERSION)
        w.fixed(self.session, wire.SESSION_BYTES)
        w.u64(self.round_id)
        w.raw(self.params)
        w.count(len(self.seeds))
        for item in self.seeds:
            w.u64(item.client_id)
            w.raw(item.sealed)

    @classmethod
    def _read(cls, r: Reader) -> wire.Message:
        _version(r)
        session, round_id = r.fixed(wire.SESSION_BYTES, "session id"), r.u64("round")
        params = r.raw("PSU parameters")
        n = r.count("seeds", 12)
        seeds = tuple(SeedItem(r.u64("client id"), r.raw("sealed seed")) for _ in range(n))
        return cls(session, round_id, params, seeds)


@wire.register_message
@dataclass(frozen=True, eq=False)
class PsuTotalResponse(wire.Message):
    """S1's PSU total and each client's outcome."""

    KIND: ClassVar[int] = 129
    results: tuple[wire.ClientResult, ...]
    total: NDArray[np.uint64] = field(repr=False)

    def _write(self, w: Writer) -> None:
        w.u8(PSU_WIRE_VERSION)
        w.count(len(self.results))
        for res in self.results:
            w.u64(res.client_id)
            w.u8(0 if res.ok else 1)
            w.raw(res.payload)
        w.array(self.total)

    @classmethod
    def _read(cls, r: Reader) -> wire.Message:
        _version(r)
        n = r.count("results", 13)
        results = []
        for _ in range(n):
            cid, status = r.u64("client id"), r.u8("status")
            if status not in (0, 1):
                raise WireFormatError(f"bad client status {status}")
            results.append(wire.ClientResult(cid, status == 0, r.raw("reason")))
        total = r.array("total")
        if total.dtype != np.uint64 or total.ndim != 1:
            raise WireFormatError("the PSU total must be a 1-d uint64 array")
        return cls(tuple(results), total.astype(np.uint64, copy=False))


class PSUService:
    """The PSU service (see the module docstring); registered by default.

    Parameters
    ----------
    host : HelperService
        The host, for S1's key pair and round limits.
    """

    name = "psu"

    def __init__(self, host: HelperService) -> None:
        self.host = host

    def methods(self) -> Mapping[str, Method]:
        """Return ``PsuSum``."""
        return {"PsuSum": Method(PsuSumRequest, self._psu_sum)}

    def _psu_sum(self, session: Session | None, message: PsuSumRequest) -> wire.Message:
        assert session is not None
        rid = message.round_id
        try:
            psu = psu_params_from_bytes(message.params)
        except UnionInputError as err:
            raise HelperRequestError(f"bad PSU parameters: {err}") from None
        limits = self.host.limits
        if psu.vector_length > limits.max_domain_size + psu.num_partitions:
            raise HelperRequestError(
                f"PSU vector of {psu.vector_length} words exceeds --max-domain "
                f"({limits.max_domain_size})"
            )
        if len(message.seeds) > limits.max_clients_per_round:
            raise HelperRequestError(
                f"{len(message.seeds)} PSU seeds exceed --max-clients-per-round "
                f"({limits.max_clients_per_round})"
            )
        summed: set[int] = session.data.setdefault(_DATA, set())
        if rid in summed:
            raise HelperRequestError(f"round {rid}'s PSU was already summed (replay)")
        key = ("psu", rid)
        session.charge(key, 16 * psu.vector_length, f"round {rid}'s PSU total")  # total + stream
        try:
            binding = psu_binding(session.session_id, rid, psu)
            total = np.zeros(psu.vector_length, np.uint64)
            seen: set[int] = set()
            results = []
            for item in message.seeds:
                reason = None
                if item.client_id in seen:
                    reason = f"client {item.client_id} sent two PSU seeds in round {rid}"
                else:
                    seen.add(item.client_id)
                    try:
                        seed = open_psu_seed(
                            self.host.keypair,
                            item.sealed,
                            binding=binding,
                            client_id=item.client_id,
                        )
                        total += helper_vector(psu, seed)
                    except ClientInputError as err:
                        reason = f"{type(err).__name__}: {err}"
                results.append(client_result(item.client_id, reason))
        finally:
            session.release(key)
        summed.add(rid)
        log_results("PsuSum", rid, results)
        return PsuTotalResponse(tuple(results), total)


def request_psu_total(
    helper: Any, round_id: int, params: bytes, seeds: Iterable[tuple[int, bytes]]
) -> tuple[NDArray[np.uint64], dict[int, str]]:
    """S0 side: relay sealed PSU seeds to S1 and return its total and the refused clients.

    Goes through the connection's authenticated session call (the session secret travels as
    with every other call), for :class:`~flwr_fsl.helper.InProcessHelper` and
    :class:`~flwr_fsl.helper.HelperClient` alike.

    Parameters
    ----------
    helper : HelperConnection
        The connection to S1.
    round_id : int
        The server round.
    params : bytes
        The round's encoded PSU parameters.
    seeds : iterable of (int, bytes)
        ``(client id, sealed seed)``.

    Returns
    -------
    tuple[numpy.ndarray, dict[int, str]]
        S1's total and ``client id -> reason`` for the clients S1 refused.

    Raises
    ------
    HelperRequestError
        If the connection cannot make session calls or S1 refuses the call.
    HelperError
        If S1's answer is malformed or does not answer every client once.
    """
    call = getattr(helper, "_call", None)
    if call is None:
        raise HelperRequestError(f"{type(helper).__name__} cannot relay a PSU to S1")
    items = tuple(SeedItem(int(c), s) for c, s in seeds)
    request = PsuSumRequest(helper.session_id, round_id, params, items)
    response: PsuTotalResponse = call("PsuSum", request, PsuTotalResponse)
    if sorted(r.client_id for r in response.results) != sorted(i.client_id for i in items):
        raise HelperError("S1's PSU answer does not name each relayed client once")
    return response.total, {r.client_id: r.reason for r in response.results if not r.ok}
