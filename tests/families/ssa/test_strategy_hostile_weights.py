"""Hostile weights in secure mode (issue 8 item 6, the two-server path).

In plaintext ``FedSubAvg`` S0 reads each reply's weight and drops one above ``max_weight``
(``tests/families/topk/test_strategy.py``). In secure mode S0 never sees a weight: the client's
weight and every weighted value ``c * dw`` are fixed-point words bounded by the round's public
``max_abs``, which the client's own encoder enforces. A finite but huge ``num-examples`` (top-k
mode) or per-row count (index mode) therefore makes that client's reply an error — dropped by
S0 with a reason that names no value — and the others are aggregated exactly, the model
staying finite. (A client that builds its own keys is outside this model: see
``tests/families/ssa/test_malicious_client.py``.) That is with ``weighted=True``; with unit
weights (the default) the client's weight is never read and a huge one changes nothing.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import RecordDict

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.families.ssa import test_index_strategy as index_app
from tests.flower_apps import MODEL, corrupt_mod, make_app, model_record

MAX_ABS = 1e3
RATIO = 0.2


def _weight(value: float):  # type: ignore[no-untyped-def]
    def corrupt(c: RecordDict) -> RecordDict:
        c["metrics"]["num-examples"] = value
        return c

    return corrupt


def _assert_dropped_without_values(reason: str) -> None:
    assert reason.startswith("train: client error") and "max_abs" in reason, reason
    # Issue 8 item 4: the text S0 gets names only the public bound, never the weight.
    assert set(re.findall(r"\d+(?:\.\d+)?(?:e\+?\d+)?", reason)) <= {"1000.0"}, reason


# The client encoder checks the bound before multiplying: no numpy overflow warning either.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("weight", [1e308, 2 * MAX_ABS], ids=["1e308", "above max_abs"])
def test_topk_a_huge_num_examples_drops_that_client_and_the_rest_stays_exact(
    weight: float,
) -> None:
    key = SealingKeyPair.generate()
    bad_pid = 1
    # The corruption sits between ssa_mod and the user's (top-k) reply: what a client whose
    # data claims a huge weight hands to the encoder.
    mods = [ssa_mod, corrupt_mod(bad_pid, _weight(weight)), topk_mod]
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app(mods), 4, run_config)
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key),
        topk_ratio=RATIO,
        min_available_nodes=4,
        frac_bits=32,
        max_abs=MAX_ABS,
        weighted=True,
    )
    secure = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2)
    bad = list(grid.get_node_ids())[bad_pid]
    assert strategy.failed_rounds == {}
    for rnd in (1, 2):
        assert set(strategy.dropped[rnd]) == {bad}
        _assert_dropped_without_values(strategy.dropped[rnd][bad])

    m = sum(v.size for v in MODEL.values() if v.dtype == np.float32)
    plain_grid = InProcessGrid(
        make_app([topk_mod]),
        4,
        {"topk-count": int(np.ceil(RATIO * m)), "topk-error-feedback": False},
        drop_nodes=lambda node, _: node == bad,
    )
    plain = FedSubAvg(min_available_nodes=4, fraction_evaluate=0.0).start(
        grid=plain_grid, initial_arrays=model_record(), num_rounds=2
    )
    for name, value in MODEL.items():
        got = secure.arrays[name].numpy()
        assert np.all(np.isfinite(got))
        if value.dtype == np.float32:
            np.testing.assert_allclose(got, plain.arrays[name].numpy(), atol=1e-6)


def test_index_mode_huge_per_row_counts_drop_that_client_and_the_rest_stays_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest_rows = index_app.client_rows
    bad_pid = 2

    def rows(pid: int, server_round: int, fixed: bool) -> tuple[np.ndarray, np.ndarray]:
        idx, counts = honest_rows(pid, server_round, fixed)
        return idx, (np.full_like(counts, 1e300) if pid == bad_pid else counts)

    monkeypatch.setattr(index_app, "client_rows", rows)  # what make_index_app's clients use
    key = SealingKeyPair.generate()
    # DP off on both ends: with DP (index mode's default) the weights are clipped to
    # max_weight before encoding, so a huge count could not reach the codec's bound.
    grid = InProcessGrid(
        index_app.make_index_app(True),
        4,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=index_app.no_floor(4),
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        index_app.K,
        dp=None,
        frac_bits=32,
        max_abs=MAX_ABS,
        min_available_nodes=4,
        weighted=True,
    )
    result = strategy.start(grid=grid, initial_arrays=index_app.initial(), num_rounds=2)
    bad = list(grid.get_node_ids())[bad_pid]
    assert strategy.failed_rounds == {}
    for rnd in (1, 2):
        assert set(strategy.dropped[rnd]) == {bad}
        _assert_dropped_without_values(strategy.dropped[rnd][bad])
    table = index_app.TABLE.astype(np.float64)
    for rnd in (1, 2):
        num, den = np.zeros_like(table), np.zeros(index_app.ROWS)
        for pid in (0, 1, 3):
            idx, counts = honest_rows(pid, rnd, True)
            num[idx] += counts[:, None] * index_app.row_delta(pid, rnd, idx).astype(np.float32)
            den[idx] += counts
        touched = den > 0
        table[touched] += num[touched] / den[touched, None]
        table = table.astype(np.float32).astype(np.float64)
    got = result.arrays["emb"].numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, table, atol=1e-6)


def test_unit_weights_never_read_a_huge_num_examples() -> None:
    key = SealingKeyPair.generate()
    mods = [ssa_mod, corrupt_mod(1, _weight(1e308)), topk_mod]
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key), topk_ratio=RATIO, min_available_nodes=4, max_abs=MAX_ABS
    )
    result = strategy.start(
        grid=InProcessGrid(make_app(mods), 4, run_config),
        initial_arrays=model_record(),
        num_rounds=1,
    )
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}
    assert all(np.all(np.isfinite(result.arrays[n].numpy())) for n in MODEL)
