"""WidthFedAvg + width_mod under every reply fault of :mod:`flwr_fsl.testing.faults` (issue 24).

One faulty node of 6 (rates 1, 1/2, 1/4 by partition). Phases: ``capacity`` (asked once per node,
in round 1) and ``train`` (the fault hits round 2's, so "replay" and "stale" have round 1's
reply to send). Verdicts (issue 24's shared definitions, and one more for plaintext):

``dropped``   the node is in ``strategy.dropped[r]`` with a reason, nobody else is dropped, and
              the model equals a run where that node never answered that phase;
``harmless``  nobody is dropped and the model equals the fault-free run;
``input``     a format-valid reply that a plaintext server cannot tell from an honest one (a
              bit flipped inside a value): the client's input, each coordinate's change
              bounded by ``clipping_range``.

A capacity reply holds no bytes value, so "flip", "truncate" and "oversize" do not apply to it
(its malformed fields are ``test_strategy.py``'s ``test_malformed_capacity_replies_*``); and
the phase asks each node once, so "replay" and "stale" never have an earlier reply to send:
they leave the run as it was (harmless, checked).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from flwr_fsl.families.width.records import WIDTH_KEY
from flwr_fsl.families.width.rules import WidthAssignment
from flwr_fsl.strategies import WidthFedAvg
from flwr_fsl.testing.faults import FAULT_KINDS, ReplyFault
from tests.families.width.test_strategy import _arrays, _grid, _initial, _record

NODES, BAD, ROUNDS = 6, 1004, 2


def _other_digest(content: RecordDict) -> RecordDict:
    """Format-valid but wrong: the reply names another width assignment."""
    other = WidthAssignment(9, 0.5, "rolling", {"h": np.array([1])})
    content[WIDTH_KEY] = ConfigRecord({"phase": "train", "digest": other.digest})
    return content


def _too_wide(content: RecordDict) -> RecordDict:
    """Format-valid but wrong: a capacity above the global model's rate."""
    content[WIDTH_KEY] = ConfigRecord({"phase": "capacity", "rate": 2.0})
    return content


TRAIN_CASES = {
    # case: (fault kind, ReplyFault options, verdict, words of the reason)
    "drop": ("drop", {}, "dropped", "no reply"),
    "error": ("error", {}, "dropped", "client error"),
    # The largest bytes are an npy-encoded Array: its first byte is the format's magic ...
    "flip": ("flip", {}, "dropped", "cannot be decoded"),
    # ... its last the top byte of the last float32: a value changes by a power of two.
    "flip-value": ("flip", {"offset": -1}, "input", ""),
    "truncate": ("truncate", {}, "dropped", "cannot be decoded"),
    "oversize": ("oversize", {"extra_bytes": 4096}, "harmless", ""),  # not read past the array
    "duplicate": ("duplicate", {}, "harmless", ""),
    # Round 1's slice names round 1's assignment (the rolling window moved).
    "replay": ("replay", {}, "dropped", "width assignment"),
    "stale": ("stale", {}, "dropped", "different replies"),
    "wrong": ("wrong", {"rewrite": _other_digest}, "dropped", "width assignment"),
}
CAPACITY_CASES = {
    "drop": ("drop", {}, "dropped", "no reply"),
    "error": ("error", {}, "dropped", "client error"),
    "duplicate": ("duplicate", {}, "harmless", ""),
    "replay": ("replay", {}, "harmless", ""),  # never applies: one capacity reply per node
    "stale": ("stale", {}, "harmless", ""),
    "wrong": ("wrong", {"rewrite": _too_wide}, "dropped", "capacity: rate"),
}
NOT_APPLICABLE = {"capacity": {"flip", "truncate", "oversize"}}


def _silent(phase: str):  # type: ignore[no-untyped-def]
    """The faulty node's first reply to ``phase`` of the faulted round is lost."""
    lost: list[int] = []

    def silent(node: int, msg: Message) -> bool:
        record = msg.content.config_records.get(WIDTH_KEY)
        if lost or node != BAD or record is None or record.get("phase") != phase:
            return False
        config = msg.content.config_records.get("config")
        if phase == "train" and (config is None or config.get("server-round") != 2):
            return False
        lost.append(node)
        return True

    return silent


def _run(fault: ReplyFault | None = None, silent: str | None = None):  # type: ignore[no-untyped-def]
    grid = _grid(NODES, tamper_replies=fault, drop_nodes=_silent(silent) if silent else None)
    strategy = WidthFedAvg(min_available_nodes=NODES, fraction_evaluate=0.0, sampling_seed=1)
    result = strategy.start(grid, _record(_initial()), num_rounds=ROUNDS)
    return strategy, _arrays(result.arrays)


@pytest.fixture(scope="module")
def references():  # type: ignore[no-untyped-def]
    refs = {
        "clean": _run()[1],
        "capacity": _run(silent="capacity")[1],
        "train": _run(silent="train")[1],
    }
    for a, b in (("clean", "capacity"), ("clean", "train"), ("capacity", "train")):
        assert not np.allclose(refs[a]["head.weight"], refs[b]["head.weight"])  # they differ
    return refs


def _close(got: dict, want: dict) -> None:  # type: ignore[type-arg]
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5)


def test_every_fault_kind_has_a_case_in_every_phase() -> None:
    for phase, cases in (("train", TRAIN_CASES), ("capacity", CAPACITY_CASES)):
        kinds = {kind for kind, *_ in cases.values()}
        assert kinds | NOT_APPLICABLE.get(phase, set()) == set(FAULT_KINDS), phase


@pytest.mark.parametrize(
    ("phase", "case"),
    [("train", c) for c in TRAIN_CASES] + [("capacity", c) for c in CAPACITY_CASES],
)
def test_phase_fault(phase: str, case: str, references) -> None:  # type: ignore[no-untyped-def]
    kind, options, verdict, reason = (TRAIN_CASES if phase == "train" else CAPACITY_CASES)[case]
    occurrence = 1 if phase == "train" else 0
    fault = ReplyFault(BAD, kind, family=WIDTH_KEY, phase=phase, occurrence=occurrence, **options)
    strategy, model = _run(fault)
    fault_round = occurrence + 1
    assert fault.applied == (0 if phase == "capacity" and kind in ("replay", "stale") else 1)
    assert not strategy.failed_rounds
    others = {r: d for r, d in strategy.dropped.items() if r != fault_round}
    assert all(d == {} for d in others.values())
    if verdict == "dropped":
        assert set(strategy.dropped[fault_round]) == {BAD}
        assert reason in strategy.dropped[fault_round][BAD], strategy.dropped[fault_round][BAD]
        _close(model, references[phase])
    elif verdict == "harmless":
        assert strategy.dropped[fault_round] == {}
        _close(model, references["clean"])
    else:
        assert verdict == "input" and strategy.dropped[fault_round] == {}
        changed = False
        for name, value in model.items():
            change = np.abs(value.astype(np.float64) - references["clean"][name])
            assert np.all(change <= 8.0 + 1e-5), name  # clipping_range bounds the client
            changed = changed or bool(np.any(change > 0))
        assert changed
