"""The in-process SecAgg driver: one whole round of the protocol's parties in one process.

:func:`run_round` runs the phases :class:`~flwr_fsl.families.secagg.strategy.SecAggPhases` runs
over Flower (advertise, share, masked input, unmask, result) between
:class:`~flwr_fsl.families.secagg.protocol.SecAggClient` and
:class:`~flwr_fsl.families.secagg.protocol.SecAggServer`, without Flower, for tests,
benchmarks and notebooks, optionally passing every client's state through its byte format as
the mod does; :class:`RoundOutcome` is what it returns. Re-exported by
:mod:`flwr_fsl.families.secagg.protocol`, which it imports lazily (the protocol module imports
this one last).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.secagg.messages import SecAggParams, decode_rows, encode_ids, encode_rows

if TYPE_CHECKING:
    from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggServer

__all__ = ["DROPOUT_PHASES", "RoundOutcome", "run_round"]

_T = TypeVar("_T")

DROPOUT_PHASES = ("share", "mask", "unmask")
"""Phases a client may go silent from in :func:`run_round` (it answered the ones before)."""


@dataclass
class RoundOutcome:
    """What :func:`run_round` returns: the aggregate and the round's view of every party.

    Attributes
    ----------
    total : numpy.ndarray
        ``sum_{u in U3} x_u`` in ``Z_2^64`` (per position over its holders in a subset round).
    server : SecAggServer
        The server after reconstruction (``survivors``, ``sharers()``, ``participants()``).
    clients : dict[int, SecAggClient]
        Every client's final state.
    masked : dict[int, numpy.ndarray]
        ``y_u`` of every client that sent its masked input.
    up_bytes, down_bytes : int
        Bytes the clients sent and received in all: protocol payloads, no transport framing;
        a request counts for every client it is sent to, silent or not.
    client_seconds, server_seconds : float
        Time spent in the clients' and the server's methods.
    """

    total: NDArray[np.uint64]
    server: SecAggServer
    clients: dict[int, SecAggClient]
    masked: dict[int, NDArray[np.uint64]]
    up_bytes: int = 0
    down_bytes: int = 0
    client_seconds: float = 0.0
    server_seconds: float = 0.0

    @property
    def survivors(self) -> tuple[int, ...]:
        """``U3``: the clients whose input is in :attr:`total`."""
        return self.server.survivors


def run_round(  # noqa: C901, PLR0915
    inputs: Mapping[int, NDArray[np.uint64]],
    params: SecAggParams,
    *,
    dropouts: Mapping[str, Iterable[int]] | None = None,
    rows: Mapping[int, NDArray[np.int64]] | None = None,
    persist: bool = False,
) -> RoundOutcome:
    """Drive one SecAgg round in this process: advertise, share, masked input, unmask, result.

    The same phases :class:`~flwr_fsl.families.secagg.strategy.SecAggPhases` runs over Flower,
    without Flower: for tests, benchmarks and notebooks.

    Parameters
    ----------
    inputs : Mapping[int, numpy.ndarray]
        Client id -> ``x_u`` (``params.vector_length`` uint64 words, or ``len(rows[u])`` in a
        subset round); clients take their turns in this order.
    params : SecAggParams
        The round.
    dropouts : Mapping[str, Iterable[int]], optional
        Phase (one of :data:`DROPOUT_PHASES`) -> the clients that go silent from that phase
        on (``"mask"``: shared their keys, then sent no masked input).
    rows : Mapping[int, numpy.ndarray], optional
        Client id -> ``R_u``: makes it a subset round (Niu Alg. 1); the server assigns the
        rows of ``U2``.
    persist : bool
        Pass every client's state through :meth:`SecAggClient.to_bytes` between messages, and
        the shared rows through their codec, as the Flower mod keeps them.

    Returns
    -------
    RoundOutcome
        The aggregate and the parties' states.

    Raises
    ------
    ConfigurationError
        If ``dropouts`` names another phase.
    TooFewSurvivorsError
        If fewer than ``t`` clients are left at some step.
    RoundFailedError
        If the shares are inconsistent.
    """
    # Imported here: protocol re-exports this module's names, importing it last.
    from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggServer

    drops = {k: set(v) for k, v in (dropouts or {}).items()}
    if set(drops) - set(DROPOUT_PHASES):
        raise ConfigurationError(f"dropouts are keyed by {DROPOUT_PHASES}, got {sorted(drops)}")
    clock = {"client": 0.0, "server": 0.0}
    traffic = {"up": 0, "down": 0}
    states: dict[int, SecAggClient | bytes] = {}

    def party(side: str, action: Callable[[], _T]) -> _T:
        start = time.perf_counter()
        out = action()
        clock[side] += time.perf_counter() - start
        return out

    def client(u: int, action: Callable[[SecAggClient], _T]) -> _T:
        def step() -> _T:
            state = states[u]
            c = SecAggClient.from_bytes(state) if isinstance(state, bytes) else state
            out = action(c)
            states[u] = c.to_bytes() if persist else c
            return out

        return party("client", step)

    def sent(data: bytes | NDArray[np.uint64], up: bool = True) -> None:
        traffic["up" if up else "down"] += len(data) if isinstance(data, bytes) else data.nbytes

    server = party("server", partial(SecAggServer, params))
    for u in inputs:
        fresh = party("client", partial(SecAggClient, u, params))
        states[u] = fresh.to_bytes() if persist else fresh
        ad = client(u, SecAggClient.advertise)
        sent(ad)
        party("server", partial(server.add_advertisement, u, ad))
    roster = party("server", server.roster)
    gone = drops.get("share", set())
    for u in inputs:
        sent(roster, up=False)  # asked, whether or not it answers
        if u not in gone:
            bundle = client(u, partial(SecAggClient.share_keys, roster=roster))
            sent(bundle)
            party("server", partial(server.add_shares, u, bundle))
    u2 = party("server", server.sharers)
    shared = None
    if rows is not None:
        shared = party("server", partial(server.assign_rows, {u: rows[u] for u in u2}))
    gone = gone | drops.get("mask", set())
    masked: dict[int, NDArray[np.uint64]] = {}
    for u in inputs:
        if u not in u2:
            continue
        sent(encode_ids(u2), up=False)
        wire = b"" if shared is None else encode_rows(shared[u])
        sent(wire, up=False)
        if u in gone:
            continue
        mine = None
        if shared is not None:
            mine = decode_rows(wire, params.vector_length) if persist else shared[u]
        r = None if rows is None else rows[u]
        y = client(
            u,
            partial(
                SecAggClient.masked_input, sharers=u2, vector=inputs[u], rows=r, shared_rows=mine
            ),
        )
        sent(y)
        masked[u] = y
        party("server", partial(server.add_masked_input, u, y))
    gone = gone | drops.get("unmask", set())
    for u in server.survivors:
        request = party("server", partial(server.unmask_request, u))
        sent(request, up=False)
        if u in gone:
            continue
        reply = client(u, partial(SecAggClient.unmask, request=request))
        sent(reply)
        party("server", partial(server.add_unmask, u, reply))
    total = party("server", server.result)
    clients = {
        u: SecAggClient.from_bytes(s) if isinstance(s, bytes) else s for u, s in states.items()
    }
    return RoundOutcome(
        total, server, clients, masked, traffic["up"], traffic["down"], clock["client"],
        clock["server"],
    )  # fmt: skip
