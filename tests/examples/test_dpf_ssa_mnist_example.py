"""examples/dpf-ssa-mnist on the in-process grid: secure vs plaintext top-k vs dense FedAvg.

The flagship's ServerApp experiment on a tiny setting (3 clients, 2 rounds, 100 training
images each): secure top-k equals plaintext top-k up to fixed point; the dense FedAvg arm
trains from the same model and clients; the app prints each arm's upload per client and round,
measured on the clients' replies, with the upload relative to dense and to plaintext top-k, and
what S0 saw of the clients (recorded from the plaintext server's decoded replies) beside what
the secure aggregate gives it. ``compare-dense = false`` keeps a dense row, sized as one dense
reply of the model.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.experiment import load_experiment
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.testing import InProcessGrid
from tests.prepared_data import require_prepared

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "dpf-ssa-mnist"
CLIENTS = 3
TINY = {
    "num-server-rounds": 2,
    "fraction-train": 1.0,
    "min-nodes": CLIENTS,
    "max-client-samples": 100,
    "test-size": 300,
}


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[ModuleType, ModuleType]]:
    require_prepared("mnist")
    sys.path.insert(0, str(APP_DIR))
    try:
        from dpf_ssa_mnist import client_app, server_app

        yield client_app, server_app
    finally:
        sys.path.remove(str(APP_DIR))


def run(example: tuple[ModuleType, ModuleType], **extra: object):  # type: ignore[no-untyped-def]
    client_app, server_app = example
    key = SealingKeyPair.generate()
    config = {**TINY, **extra, "ssa-helper-fingerprint": key.fingerprint}
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    return server_app.run_experiment(grid, config, helper=InProcessHelper(keypair=key))


def _row(out: str, label: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(label))
    return line[len(label) :].split()


def test_secure_plaintext_and_dense_arms_with_upload_vs_dense_and_s0_view(
    example: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, server_app = example
    result = run(example, **{"results-dir": str(tmp_path)})
    out = capsys.readouterr().out
    record = result.record
    assert [a.key for a in record.arms] == ["secure", "plaintext", "dense"]
    assert record.baseline == "dense"
    for arm in record.arms:
        assert arm.aggregated_rounds == [1, 2], arm.key
        assert all(not r.dropped and r.failed is None for r in arm.rounds), arm.key
    secure, plain, dense = (result.arm(k) for k in ("secure", "plaintext", "dense"))
    # Secure == plaintext top-k up to fixed point; dense FedAvg is another training.
    for name, value in plain.arrays.items():
        np.testing.assert_allclose(secure.arrays[name], value, atol=1e-6, err_msg=name)
    assert (
        max(float(np.max(np.abs(dense.arrays[n] - plain.arrays[n]))) for n in plain.arrays) > 1e-3
    )

    # The dense arm's clients upload the whole model: one dense reply's bytes every round.
    initial = server_app.ArrayRecord(server_app.Net().state_dict())
    sized = server_app.dense_reply_bytes(initial)
    for rnd in dense.record.rounds:
        assert rnd.up_bytes is not None and abs(rnd.up_bytes - sized) <= 16, (rnd, sized)
    # Upload per client and round, measured, printed vs dense and vs plaintext top-k.
    up = {k: result.arm(k).record.mean("up_bytes") for k in ("secure", "plaintext", "dense")}
    assert up["plaintext"] < up["dense"] < up["secure"]  # MNIST CNN, k = 10%: SSA costs more
    labels = {
        "secure": "secure (SSA): DPF keys of the top-k",
        "plaintext": "plaintext top-k: sparse update",
        "dense": "dense FedAvg: the whole model",
    }
    for key, label in labels.items():
        cells = _row(out, label)
        assert cells[0] == f"{up[key]:,.0f}"
        assert cells[2] == f"{up[key] / up['dense']:.1%}"
        assert cells[3] == f"{up[key] / up['plaintext']:.1%}"
    assert "up vs dense" in out  # also the summary's relative column (baseline dense)

    # What S0 saw in round 1: every client's set and weight in plaintext, sums under SSA.
    view = record.extra["s0_view"]
    clients = view["plaintext"]["clients"]
    k = server_app.topk_count(initial, 0.1)
    assert len(clients) == CLIENTS
    assert all(c["coordinates"] == k and c["num_examples"] == 100 for c in clients.values())
    assert all(sum(c["per_tensor"].values()) == k for c in clients.values())
    # The same clients and the same first-round updates: the aggregate touches the union.
    assert view["secure"]["touched"] == view["plaintext"]["touched"]
    assert 0 < view["plaintext"]["touched_by_one_client"] <= view["plaintext"]["touched"]
    assert "what S0 saw of the clients in round 1:" in out
    # The secure claim printed: S0's per-client view has one size for every client.
    sizes = {
        rnd: set(secure.strategy.rounds[rnd].phase("train").up_bytes.values()) for rnd in (1, 2)
    }
    assert all(len(s) == 1 for s in sizes.values()), sizes
    assert {view["secure"]["up_bytes_per_client"]} == sizes[1]
    # Saved with the histories.
    saved = load_experiment(tmp_path / "dpf-ssa-mnist.json")
    assert saved.extra["upload"][labels["dense"]]["up_bytes"] == up["dense"]
    assert (tmp_path / "global-model-dense.npz").exists()


def test_without_the_dense_arm_the_dense_row_is_one_sized_reply(
    example: tuple[ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    _, server_app = example
    result = run(example, **{"compare-dense": False, "num-server-rounds": 1})
    out = capsys.readouterr().out
    assert [a.key for a in result.record.arms] == ["secure", "plaintext"]
    assert result.record.baseline == "plaintext"
    sized = server_app.dense_reply_bytes(server_app.ArrayRecord(server_app.Net().state_dict()))
    cells = _row(out, "dense FedAvg (one reply, sized)")
    assert cells[:3] == [f"{sized:,}", "n/a", "100.0%"]
    secure_up = result.arm("secure").record.mean("up_bytes")
    assert _row(out, "secure (SSA): DPF keys of the top-k")[2] == f"{secure_up / sized:.1%}"


def test_client_evaluation_needs_the_explicit_opt_in(
    example: tuple[ModuleType, ModuleType],
) -> None:
    # Federated evaluation would hand S0 each client's metrics and num-examples in the clear:
    # the secure arm refuses it at construction unless ssa-plaintext-evaluation = true.
    from flwr_fsl.core.errors import ConfigurationError

    tiny = {"num-server-rounds": 1, "compare-plaintext": False, "fraction-evaluate": 1.0}
    with pytest.raises(ConfigurationError, match="plaintext_evaluation=True"):
        run(example, **tiny)
    result = run(example, **tiny, **{"ssa-plaintext-evaluation": True, "ssa-weighted": True})
    rnd = result.arm("secure").record.rounds[0]
    assert rnd.failed is None and rnd.evaluate_metrics, rnd  # the clients' metrics, in clear
