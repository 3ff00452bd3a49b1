"""The in-process transport: a refused reply drops only its node, with the phase in the reason."""

from __future__ import annotations

from typing import Any

import pytest

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.exchange import encode_once, local_exchange


class _Echo:
    def __init__(self, node: int, refuse: bool = False) -> None:
        self.node, self.refuse = node, refuse

    def answer(self, label: str, ask: Any) -> Any:
        if self.refuse:
            raise ClientInputError("bad ask")
        return (self.node, label, ask)


def test_replies_come_back_and_a_refusing_party_is_dropped() -> None:
    dropped: dict[int, str] = {}
    exchange = local_exchange({1: _Echo(1), 2: _Echo(2, refuse=True), 3: _Echo(3)}, dropped)
    taken: list[int] = []
    replies = exchange("advertise", {1: "a", 2: "a", 3: "b"}, lambda n, r: taken.append(n))
    assert replies == {1: (1, "advertise", "a"), 3: (3, "advertise", "b")}
    assert taken == [1, 3]
    assert dropped == {2: "advertise: bad ask"}


def test_accept_and_tamper_can_refuse() -> None:
    dropped: dict[int, str] = {}

    def tamper(label: str, node: int, reply: Any) -> Any:
        if node == 1:
            raise ClientInputError("silent")
        return reply

    def accept(node: int, reply: Any) -> None:
        if node == 2:
            raise ClientInputError("does not decode")

    exchange = local_exchange({n: _Echo(n) for n in (1, 2, 3)}, dropped, tamper)
    assert set(exchange("train", {1: 0, 2: 0, 3: 0}, accept)) == {3}
    assert dropped == {1: "train: silent", 2: "train: does not decode"}


def test_other_errors_are_not_swallowed() -> None:
    # Only a client's bad input drops it; a bug in the server's accept must surface.
    exchange = local_exchange({1: _Echo(1)}, {})
    with pytest.raises(ZeroDivisionError):
        exchange("x", {1: 0}, lambda n, r: 1 / 0)


def test_encode_once_per_distinct_ask() -> None:
    shared, own = object(), object()
    calls: list[object] = []

    def make(ask: object) -> str:
        calls.append(ask)
        return f"req{len(calls)}"

    assert encode_once({1: shared, 2: shared, 3: own}, make) == {1: "req1", 2: "req1", 3: "req2"}
    assert calls == [shared, own]
