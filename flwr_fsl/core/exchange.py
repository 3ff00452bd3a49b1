"""The transport a Flower-free protocol server talks through, and its in-process twin.

A family's round server (SFSL's :class:`~flwr_fsl.families.sfsl.server.SFSLServer`, SESA's
:class:`~flwr_fsl.families.sesa.server.SesaRoundServer`) never sends a message itself: it calls
``exchange(label, {node: ask}, accept)`` and gets back ``{node: reply}`` for the nodes whose
reply ``accept`` took. The Flower strategy implements ``exchange`` over its typed phases
(:meth:`~flwr_fsl.core.engine.PhasedStrategy.send_phase`); :func:`local_exchange` implements it
by calling in-process parties, so the same server runs a round with no Flower at all. In both,
a :class:`~flwr_fsl.core.errors.ClientInputError` — from the party or from ``accept`` — drops
that node only, with the phase's label in the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Protocol

from flwr_fsl.core.errors import ClientInputError

__all__ = ["Accept", "Exchange", "Party", "encode_once", "local_exchange"]

Accept = Callable[[int, Any], object]
"""``accept(node, reply)``: take a reply into the protocol (raise ClientInputError to refuse it)."""
Exchange = Callable[[str, Mapping[int, Any], Accept], dict[int, Any]]
"""``exchange(label, {node: ask}, accept) -> {node: reply}`` for the nodes whose reply was taken."""


class Party(Protocol):
    """An in-process client: answers one ask of a labelled phase."""

    def answer(self, label: str, ask: Any) -> Any:
        """Return the reply to ``ask`` (raise ClientInputError to refuse it)."""


def local_exchange(
    parties: Mapping[int, Party],
    dropped: MutableMapping[int, str],
    tamper: Callable[[str, int, Any], Any] | None = None,
) -> Exchange:
    """Return an :data:`Exchange` that calls ``parties`` directly.

    Parameters
    ----------
    parties : Mapping[int, Party]
        Node id -> the in-process client.
    dropped : MutableMapping[int, str]
        Filled with node -> ``"<label>: <reason>"`` for every node whose reply is refused.
    tamper : Callable[[str, int, Any], Any], optional
        ``tamper(label, node, reply) -> reply``: a test's hook on every reply (a deviating
        client); it may raise :class:`~flwr_fsl.core.errors.ClientInputError` to go silent.

    Returns
    -------
    Exchange
        The in-process transport.
    """

    def exchange(label: str, asks: Mapping[int, Any], accept: Accept) -> dict[int, Any]:
        replies: dict[int, Any] = {}
        for node, ask in asks.items():
            try:
                reply = parties[node].answer(label, ask)
                if tamper is not None:
                    reply = tamper(label, node, reply)
                accept(node, reply)
            except ClientInputError as err:
                dropped[node] = f"{label}: {err}"
                continue
            replies[node] = reply
        return replies

    return exchange


def encode_once(asks: Mapping[int, Any], make: Callable[[Any], Any]) -> dict[int, Any]:
    """Return ``{node: make(ask)}``, calling ``make`` once per distinct ask object.

    An ask shared by many nodes (the round's parameters, the roster) is then encoded once.
    """
    made: dict[int, Any] = {}
    requests = {}
    for node, ask in asks.items():
        if id(ask) not in made:
            made[id(ask)] = make(ask)
        requests[node] = made[id(ask)]
    return requests
