"""FedSubAvg + topk_mod under every reply fault of :mod:`flwr_fsl.testing.faults` (issue 24).

One faulty node of 6; the fault hits its train reply of round 2 (so "replay" and "stale" have
its round-1 reply to send). Each case asserts its verdict (``docs`` of issue 24's shared
definitions):

``dropped``   the node is in ``strategy.dropped[2]`` with a reason, nobody else is dropped, and
              the model equals a run where that node never answered round 2;
``harmless``  nobody is dropped and the model equals the fault-free run;
``input``     a format-valid reply that a plaintext server cannot tell from an honest update
              (a bit flipped inside a value or an index, the node's own round-1 update sent
              again): it is that client's input, taken like any other reply — nobody is
              dropped, nothing fails, and the model equals FedSubAvg over the replies as
              received, with the faulty reply's change bounded by ``clipping_range``.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from flwr_fsl.mods import topk_mod
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.faults import FAULT_KINDS, ReplyFault
from tests.flower_apps import MODEL, make_app, model_record

NODES, BAD, ROUNDS = 6, 1003, 2
RUN_CONFIG = {"topk-ratio": 0.3, "topk-error-feedback": False}


def _too_heavy(content: RecordDict) -> RecordDict:
    """Format-valid but wrong: a weight far above ``max_weight``."""
    for record in content.metric_records.values():
        record["num-examples"] = 1e12
    return content


CASES = {
    # case: (fault kind, ReplyFault options, verdict, words of the reason)
    "drop": ("drop", {}, "dropped", "no reply"),
    "error": ("error", {}, "dropped", "client error"),
    # The largest bytes are an npy-encoded Array: its first byte is the format's magic...
    "flip": ("flip", {}, "dropped", "cannot be decoded"),
    # ... its last the top byte of the last float32: a value changes by a power of two.
    "flip-value": ("flip", {"offset": -1}, "input", ""),
    "truncate": ("truncate", {}, "dropped", "cannot be decoded"),
    # Bytes after an npy array are not read: the values are the sent ones.
    "oversize": ("oversize", {"extra_bytes": 4096}, "harmless", ""),
    "duplicate": ("duplicate", {}, "harmless", ""),
    "replay": ("replay", {}, "input", ""),
    "stale": ("stale", {}, "dropped", "different replies"),
    "wrong": ("wrong", {"rewrite": _too_heavy}, "dropped", "max_weight"),
}


def _in_round_2(node: int, msg: Message) -> bool:
    return node == BAD and int(msg.content["config"]["server-round"]) == 2


def _run(fault: ReplyFault | None = None, *, silent: bool = False):  # type: ignore[no-untyped-def]
    received: list[Message] = []

    def tamper(node: int, request: Message, reply: Message) -> list[Message]:
        out = list(fault(node, request, reply)) if fault is not None else [reply]
        if int(request.content["config"]["server-round"]) == 2:
            received.extend(out)
        return out

    grid = InProcessGrid(
        make_app([topk_mod]),
        NODES,
        RUN_CONFIG,
        tamper_replies=tamper,
        drop_nodes=_in_round_2 if silent else None,
    )
    strategy = FedSubAvg(min_available_nodes=NODES, fraction_evaluate=0.0, sampling_seed=1)
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=ROUNDS)
    return strategy, {k: v.numpy() for k, v in result.arrays.items()}, received


@pytest.fixture(scope="module")
def references():  # type: ignore[no-untyped-def]
    _, clean, _ = _run()
    _, without, _ = _run(silent=True)
    assert any(not np.allclose(clean[n], without[n]) for n in MODEL)  # the verdicts differ
    return {"harmless": clean, "dropped": without}


def _aggregate_afresh(received: list[Message]) -> dict:  # type: ignore[type-arg]
    """A fresh FedSubAvg's round 2 over ``received``, from the fault-free round-1 model."""
    grid = InProcessGrid(make_app([topk_mod]), NODES, RUN_CONFIG)
    first = FedSubAvg(min_available_nodes=NODES, fraction_evaluate=0.0, sampling_seed=1)
    round1 = first.start(grid=grid, initial_arrays=model_record(), num_rounds=1).arrays
    fresh = FedSubAvg(min_available_nodes=NODES, fraction_evaluate=0.0, sampling_seed=1)
    list(fresh.configure_train(2, round1, ConfigRecord(), grid))  # sample, remember the model
    arrays, _ = fresh.aggregate_train(2, received)
    assert arrays is not None and fresh.dropped[2] == {}
    return {k: v.numpy() for k, v in arrays.items()}


def _close(got: dict, want: dict) -> None:  # type: ignore[type-arg]
    for name in MODEL:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6)


def test_every_fault_kind_has_a_case() -> None:
    assert {kind for kind, *_ in CASES.values()} == set(FAULT_KINDS)


@pytest.mark.parametrize("case", list(CASES))
def test_train_phase_fault(case: str, references) -> None:  # type: ignore[no-untyped-def]
    kind, options, verdict, reason = CASES[case]
    fault = ReplyFault(BAD, kind, message_type="train", occurrence=1, **options)
    strategy, model, received = _run(fault)
    assert fault.applied == 1
    assert not strategy.failed_rounds and strategy.dropped[1] == {}
    if verdict == "dropped":
        assert set(strategy.dropped[2]) == {BAD}
        assert reason in strategy.dropped[2][BAD], strategy.dropped[2][BAD]
        _close(model, references["dropped"])
    elif verdict == "harmless":
        assert strategy.dropped[2] == {}
        _close(model, references["harmless"])
    else:
        assert verdict == "input" and strategy.dropped[2] == {}
        assert len(received) == NODES
        _close(model, _aggregate_afresh(received))
        for name, value in model.items():
            change = np.abs(value.astype(np.float64) - references["harmless"][name])
            if np.issubdtype(MODEL[name].dtype, np.floating):
                # One client moves a coordinate by at most clipping_range.
                assert np.all(change <= 8.0 + 1e-6), name
