"""SSA under every reply fault of :mod:`flwr_fsl.testing.faults` (issue 24), with the in-process S1.

Two strategies, 4 clients, 2 rounds, one faulty client whose reply of round 2 is faulted (so
"replay" and "stale" have its round-1 reply to send):

- ``SecureFedSubAvg`` (top-k upload mode): its one phase, ``train`` (the DPF-keyed upload);
- ``SecureRowFedSubAvg`` (index mode, ``dp=None`` on both ends for exact averages): the PSR
  ``query.psr`` phase and the ``train`` phase (rows upload).

Verdicts (issue 24's shared definitions): ``dropped`` — the faulty node is in
``strategy.dropped[2]`` with a reason, nobody else is dropped, nothing fails, and the model equals
the plaintext average without that node in round 2; ``harmless`` — nobody is dropped and the
model equals the fault-free plaintext average. Beside the byte-level kinds, each phase also
gets a bit flipped deep inside its largest value ("flip-deep": S1's sealed hash of the public
part catches it) and, as "wrong", a format-valid reply whose sealed part does not open at S1.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.faults import FAULT_KINDS, ReplyFault
from tests.families.ssa.test_index_strategy import (
    ROWS,
    TABLE,
    _tamper_query,
    client_rows,
    initial,
    make_index_app,
    no_floor,
    row_delta,
)
from tests.families.ssa.test_strategy import _k, _tamper_sealed
from tests.flower_apps import MODEL, make_app, model_record, unit_weight_mod

NODES, BAD, ROUNDS, K = 4, 1002, 2, 6
BAD_PID = BAD - 1000


def _cases(wrong, first_reason: str, replay: str):  # type: ignore[no-untyped-def]
    """case: (fault kind, ReplyFault options, verdict, words of the reason)."""
    return {
        "drop": ("drop", {}, "dropped", "no reply"),
        "error": ("error", {}, "dropped", "client error"),
        "flip": ("flip", {}, "dropped", first_reason),
        "flip-deep": ("flip", {"offset": -1}, "dropped", "does not match the sealed hash"),
        "truncate": ("truncate", {}, "dropped", "truncated"),
        "oversize": ("oversize", {"extra_bytes": 4096}, "dropped", "trailing bytes"),
        "duplicate": ("duplicate", {}, "harmless", ""),
        "replay": ("replay", {}, "dropped", replay),
        "stale": ("stale", {}, "dropped", "different replies"),
        "wrong": ("wrong", {"rewrite": wrong}, "dropped", "failed authentication"),
    }


PHASES = {
    # (strategy, message type): its cases
    ("upload", "train"): _cases(_tamper_sealed, "bad magic", "key domains differ"),
    ("rows", "query.psr"): _cases(_tamper_query, "bad magic", "rejected by S1"),
    ("rows", "train"): _cases(_tamper_sealed, "bad magic", "epoch 2"),
}


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def _silent_in_round_2(node: int, msg: Message) -> bool:
    config = msg.content.config_records.get("config")
    return node == BAD and config is not None and config.get("server-round") == 2


def _upload_run(key: SealingKeyPair, fault: ReplyFault) -> tuple[SecureFedSubAvg, dict]:  # type: ignore[type-arg]
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([ssa_mod, topk_mod]), NODES, run_config, tamper_replies=fault)
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key),
        topk_ratio=0.2,
        helper_fingerprint=key.fingerprint,
        min_available_nodes=NODES,
        frac_bits=32,
        max_abs=1e3,
        fraction_evaluate=0.0,
    )
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=ROUNDS)
    return strategy, {k: v.numpy() for k, v in result.arrays.items()}


def _upload_reference(without_bad: bool) -> dict:  # type: ignore[type-arg]
    """Plaintext top-k FedSubAvg, unit weights (SSA's default), the bad node silent or not."""
    grid = InProcessGrid(
        make_app([unit_weight_mod, topk_mod]),
        NODES,
        {"topk-count": _k(0.2), "topk-error-feedback": False},
        drop_nodes=_silent_in_round_2 if without_bad else None,
    )
    strategy = FedSubAvg(min_available_nodes=NODES, fraction_evaluate=0.0)
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=ROUNDS)
    return {k: v.numpy() for k, v in result.arrays.items()}


def _rows_run(key: SealingKeyPair, fault: ReplyFault) -> tuple[SecureRowFedSubAvg, dict]:  # type: ignore[type-arg]
    grid = InProcessGrid(
        make_index_app(False),
        NODES,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=no_floor(NODES),
        tamper_replies=fault,
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        K,
        dp=None,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=NODES,
        fraction_evaluate=0.0,
    )
    result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=ROUNDS)
    return strategy, {k: v.numpy() for k, v in result.arrays.items()}


def _rows_reference(without_bad: bool) -> dict:  # type: ignore[type-arg]
    """The plaintext rows average (unit weights), the bad client left out of round 2 or not."""
    table = TABLE.astype(np.float64)
    for rnd in range(1, ROUNDS + 1):
        num, den = np.zeros_like(table), np.zeros(ROWS)
        for pid in range(NODES):
            if without_bad and rnd == 2 and pid == BAD_PID:
                continue
            idx, _ = client_rows(pid, rnd, False)
            num[idx] += row_delta(pid, rnd, idx).astype(np.float32)
            den[idx] += 1
        touched = den > 0
        table[touched] += num[touched] / den[touched, None]
        table = table.astype(np.float32).astype(np.float64)
    return {"emb": table, "local": np.ones(2)}


@pytest.fixture(scope="module")
def references():  # type: ignore[no-untyped-def]
    refs = {
        ("upload", "harmless"): _upload_reference(False),
        ("upload", "dropped"): _upload_reference(True),
        ("rows", "harmless"): _rows_reference(False),
        ("rows", "dropped"): _rows_reference(True),
    }
    for mode, name in (("upload", "fc.bias"), ("rows", "emb")):  # the verdicts differ
        assert not np.allclose(refs[(mode, "harmless")][name], refs[(mode, "dropped")][name])
    return refs


def test_every_fault_kind_has_a_case_in_every_phase() -> None:
    for cases in PHASES.values():
        assert {kind for kind, *_ in cases.values()} == set(FAULT_KINDS)


@pytest.mark.parametrize(
    ("mode", "message_type", "case"),
    [(mode, mtype, case) for (mode, mtype), cases in PHASES.items() for case in cases],
)
def test_phase_fault(mode: str, message_type: str, case: str, key, references) -> None:  # type: ignore[no-untyped-def]
    kind, options, verdict, reason = PHASES[(mode, message_type)][case]
    fault = ReplyFault(BAD, kind, message_type=message_type, occurrence=1, **options)
    strategy, model = (_upload_run if mode == "upload" else _rows_run)(key, fault)
    assert fault.applied == 1
    assert not strategy.failed_rounds and strategy.dropped[1] == {}
    if verdict == "dropped":
        assert set(strategy.dropped[2]) == {BAD}
        assert reason in strategy.dropped[2][BAD], strategy.dropped[2][BAD]
    else:
        assert verdict == "harmless" and strategy.dropped[2] == {}
    want = references[(mode, verdict)]
    for name, value in want.items():
        if name in MODEL and not np.issubdtype(MODEL[name].dtype, np.floating):
            continue  # integer buffers are not securely aggregated
        np.testing.assert_allclose(model[name], value, rtol=0, atol=1e-6)
