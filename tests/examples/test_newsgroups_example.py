"""examples/dpf-psr-newsgroups on the in-process grid: secure model == plaintext model; SSA < dense.

Three clients, two rounds, a 5,000-word vocabulary and 128 rows each: the ServerApp's experiment
trains the word table and the dense classifier head once through PSR + SSA (a mixed round,
in-process S1) and once with plaintext ``FedSubAvg`` (row-sparse table, dense head), from the
same model with the same client seeds, so the two final models (and test accuracies) agree up to
SSA's fixed-point rounding. At the example's real setting (73,712 words, ``max-rows = 2048``,
``dim = 16``) the size of a client's keys — computed by the client's encoders, checked against
the bytes the tiny run measured — is below a dense upload of the model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.protocol import SSAParams, encode_round
from flwr_fsl.families.ssa.psr import make_query
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.testing import InProcessGrid
from tests.prepared_data import require_prepared


def no_floor(nodes: int):  # type: ignore[no-untyped-def]
    """... and on the clients: node config accepting rounds without noise."""
    return lambda i: {"partition-id": i, "num-partitions": nodes, NODE_MIN_NOISE_KEY: 0.0}


APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "dpf-psr-newsgroups"
CLIENTS = 3
TINY = {"vocab-size": 5000, "max-rows": 128, "test-docs": 1000, "local-epochs": 1}


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[ModuleType, ModuleType, ModuleType]]:
    require_prepared("newsgroups")
    sys.path.insert(0, str(APP_DIR))
    try:
        from dpf_psr_newsgroups import client_app, server_app, task

        yield task, client_app, server_app
    finally:
        sys.path.remove(str(APP_DIR))


def key_bytes(domain: int, max_rows: int, dim: int) -> tuple[int, int]:
    """Return the public-part bytes of one client's fresh SSA keys and of its PSR query.

    Computed by the client's own encoders on a random row set: the sizes depend only on the
    public parameters (domain, ``max_rows``, row width, hashing), not on the rows or values.
    The upload adds S0's 16-byte seed, S1's sealed seed and Flower's framing (< 1 kB).
    """
    params = SSAParams(1, domain, max_rows, dim, os.urandom(16), max_abs=1e5)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(domain, max_rows, replace=False))
    deltas = rng.normal(0.0, 0.01, (max_rows, dim))
    upload, _ = encode_round(params, rows, deltas, np.ones(max_rows))
    assert not isinstance(upload, bytes)
    return len(upload.public_part), len(make_query(params, rows).upload.public_part)


def test_secure_equals_plaintext_with_the_dense_head(
    example: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    task, client_app, server_app = example
    key = SealingKeyPair.generate()
    config = {
        **TINY,
        "num-server-rounds": 2,
        "min-nodes": CLIENTS,
        "ssa-helper-fingerprint": key.fingerprint,
        "ssa-dp-noise-multiplier": 0.0,  # exact tables: DP off on S0 ...
    }
    grid = InProcessGrid(client_app.app, CLIENTS, config, node_config_fn=no_floor(CLIENTS))
    result = server_app.run_experiment(grid, config, helper=InProcessHelper(keypair=key))
    secure, plain = result.arm("secure"), result.arm("plaintext")
    assert secure.strategy.failed_rounds == {}
    assert all(not d for d in secure.strategy.dropped.values())
    assert all(not d for d in plain.strategy.dropped.values())
    # The same count-weighted row average and accuracy, up to SSA's fixed-point rounding.
    np.testing.assert_allclose(secure.arrays[task.TABLE], plain.arrays[task.TABLE], atol=1e-5)
    np.testing.assert_allclose(secure.arrays[task.HEAD], plain.arrays[task.HEAD], atol=1e-5)
    assert np.any(secure.arrays[task.HEAD] != task.initial_model(task.Settings())[task.HEAD])
    assert secure.record.max_abs_diff is not None and secure.record.max_abs_diff < 1e-5
    acc = server_app.ACCURACY
    assert secure.record.final(acc) == pytest.approx(plain.record.final(acc), abs=0.05)
    for s, p in zip(secure.record.rounds, plain.record.rounds, strict=True):
        assert s.server_metrics["accuracy"] == pytest.approx(p.server_metrics["accuracy"], abs=5e-4)
    # The plaintext server saw every client's rows; they are the clients' own sets.
    settings = task.Settings.from_run_config(config)
    seen = plain.strategy.seen_rows[1]
    want = {tuple(task.client_data(i, CLIENTS, settings).rows) for i in range(CLIENTS)}
    assert {tuple(rows) for rows in seen.values()} == want
    shape = task.table_shape(settings)
    assert all(len(rows) <= 128 and rows[-1] < shape.rows for rows in want)
    # Bytes: the secure download (two PSR answers) is below the plaintext one (the table).
    first = secure.record.rounds[0]
    assert first.down_bytes < plain.record.rounds[0].down_bytes
    dense = result.record.extra["dense_bytes"]
    assert dense["up"] > 4 * shape.rows * settings.dim
    assert result.record.extra["s0_view"]["plaintext_sets"]
    # key_bytes predicts what the tiny run measured, up to the seeds and Flower's framing, and
    # up to 2% for the per-bin DPF domains, which follow the run's random hash key.
    ssa, psr = key_bytes(shape.rows, settings.max_rows, settings.dim)
    # The train upload: the table's keys plus the dense head's (20 chunks of dim = 16).
    ssa += dense_key_bytes(shape.num_classes, settings.dim)
    assert 0.98 * ssa < first.phases["train"].up_bytes < 1.02 * ssa + 2_000
    assert 0.98 * psr < first.phases["psr"].up_bytes < 1.02 * psr + 1_000


def dense_key_bytes(chunks: int, width: int) -> int:
    """Return the public-part bytes of the dense part's keys: every chunk, count word 1."""
    params = SSAParams(1, chunks, chunks, width, os.urandom(16), max_abs=1e5)
    rng = np.random.default_rng(0)
    upload, _ = encode_round(
        params, np.arange(chunks), rng.normal(0, 0.01, (chunks, width)), np.ones(chunks)
    )
    assert not isinstance(upload, bytes)
    return len(upload.public_part)


def test_ssa_upload_beats_dense_at_the_real_setting(
    example: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    task, _, server_app = example
    settings = task.Settings()  # the pyproject defaults: all words, max-rows 2048, dim 16
    shape = task.table_shape(settings)
    assert shape.num_words == 73_712 and settings.max_rows == 2048 and settings.dim == 16
    ssa, psr = key_bytes(shape.rows, settings.max_rows, settings.dim)
    model = {
        task.TABLE: np.zeros((shape.rows, settings.dim), np.float32),
        task.HEAD: np.zeros((shape.num_classes, settings.dim), np.float32),
    }
    dense_up = server_app.dense_bytes(model)[1]
    assert dense_up >= 4 * shape.rows * settings.dim
    # Fresh keys plus the PSR query (+ 2 kB for seeds and framing) stay below a third of a
    # dense upload; the download (two PSR answers, one row per bin) below a fifth.
    assert ssa + psr + 2_000 < dense_up / 3
    bins = SSAParams(1, shape.rows, settings.max_rows, settings.dim, bytes(16)).num_keys
    assert 2 * bins * settings.dim * 8 < dense_up / 5


def test_client_rows_are_fixed_capped_and_weighted(
    example: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    task, _, _ = example
    settings = task.Settings.from_run_config(TINY)
    shape = task.table_shape(settings)
    data = task.client_data(0, 10, settings)
    assert data.rows.size == settings.max_rows and data.words > data.rows.size
    assert np.array_equal(data.rows, np.unique(data.rows))
    words = data.rows
    assert words.min() >= settings.stop_words and words.max() < shape.num_words
    assert set(np.unique(data.docs.words)) <= set(words)  # documents keep only chosen words
    df = np.bincount(data.docs.words, minlength=shape.num_words)
    np.testing.assert_array_equal(data.counts, df[words])
    again = task.client_data(0, 10, task.Settings.from_run_config(TINY))
    assert np.array_equal(again.rows, data.rows)


def test_training_moves_only_its_rows(example: tuple[ModuleType, ModuleType, ModuleType]) -> None:
    task, _, _ = example
    settings = task.Settings.from_run_config(TINY)
    shape = task.table_shape(settings)
    model = task.initial_model(settings)
    table = model[task.TABLE] + np.float32(0.01)  # nonzero word rows: a moved row shows
    data = task.client_data(1, 10, settings)
    trained, head, loss = task.train_client(
        table, model[task.HEAD], data, shape, epochs=1, lr=settings.lr, batch_size=16, seed=0
    )
    moved = np.flatnonzero(np.any(trained != table, axis=1))
    assert set(moved) <= set(data.rows) and len(moved) > 0.5 * data.rows.size
    assert head.shape == (shape.num_classes, settings.dim) and np.any(head != model[task.HEAD])
    assert np.isfinite(loss)


def test_settings_validation(example: tuple[ModuleType, ModuleType, ModuleType]) -> None:
    task, _, _ = example
    with pytest.raises(ValueError, match="max-rows"):
        task.Settings.from_run_config({"max-rows": 0})
    with pytest.raises(ValueError, match="fraction-evaluate"):
        task.Settings.from_run_config({"fraction-evaluate": 0.5})
    with pytest.raises(ValueError, match="partition-id"):
        task.client_data(4, 4, task.Settings())
