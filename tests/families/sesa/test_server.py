"""The in-process SESA driver (``families/sesa/server.run_round``): one round equals the
plaintext per-shard count-weighted average of what the clients trained (fixed-point error
only), a corrupted offline bundle drops exactly that client at ``offline``, and the Flower
strategy's round uses the same server object."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ClientInputError, RoundFailedError
from flwr_fsl.families.sesa.layout import SesaLayout
from flwr_fsl.families.sesa.server import SesaParty, run_round
from flwr_fsl.families.sesa.settings import SesaSettings

HIDDEN, INPUTS, OUTPUTS = 8, 6, 3
MODEL = {
    "fc1.weight": np.linspace(-1, 1, HIDDEN * INPUTS, dtype=np.float32).reshape(HIDDEN, INPUTS),
    "fc1.bias": np.zeros(HIDDEN, np.float32),
    "fc2.weight": np.linspace(1, -1, OUTPUTS * HIDDEN, dtype=np.float32).reshape(OUTPUTS, HIDDEN),
    "fc2.bias": np.full(OUTPUTS, 0.5, np.float32),
}
RATES = [1.0, 0.5, 0.25, 0.5, 0.25, 1.0, 0.25]
# weighted=True (not the default): the Flower-free round also carries per-client weights.
SETTINGS = SesaSettings(num_shards=4, weighted=True, max_weight=100.0, frac_bits=20, max_clients=50)


def _delta(node: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([node, sum(map(ord, name))])
    return (0.1 * rng.normal(size=shape)).astype(np.float32)


def _parties(n: int) -> dict[int, SesaParty]:
    parties = {}
    for i in range(n):
        node = 100 + i

        def train(narrow, node=node, weight=20 + 7 * i):  # type: ignore[no-untyped-def]
            return {k: v + _delta(node, k, v.shape) for k, v in narrow.items()}, weight

        parties[node] = SesaParty(node, RATES[i], train, np.random.default_rng(i))
    return parties


def _reference(parties: dict[int, SesaParty], nodes: tuple[int, ...]) -> dict[str, np.ndarray]:
    layout = SesaLayout.of(MODEL, 4)
    total = {k: np.zeros(v.shape) for k, v in MODEL.items()}
    count = {k: np.zeros(v.shape) for k, v in MODEL.items()}
    for node in nodes:
        party = parties[node]
        narrow = layout.width_layout(MODEL, party.choice)
        sub = narrow.extract(MODEL)
        trained, weight = party.train({k: np.array(v) for k, v in sub.items()})
        delta = {k: trained[k] - sub[k] for k in sub}
        c = float(weight) / SETTINGS.max_weight
        for name, value in MODEL.items():
            out_idx, in_idx = narrow.slices.get(name, (None, None))
            rows = np.arange(value.shape[0]) if out_idx is None else out_idx
            d = delta[name].astype(np.float64)
            if value.ndim == 1:
                total[name][rows] += c * d
                count[name][rows] += c
            else:
                cols = np.arange(value.shape[1]) if in_idx is None else in_idx
                total[name][np.ix_(rows, cols)] += c * d
                count[name][np.ix_(rows, cols)] += c
    return {
        k: MODEL[k] + np.divide(total[k], count[k], out=np.zeros_like(total[k]), where=count[k] > 0)
        for k in MODEL
    }


def _assert_close(model: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for name in MODEL:
        np.testing.assert_allclose(model[name], expected[name], atol=1e-4)


def test_run_round_equals_the_plaintext_per_shard_average() -> None:
    parties = _parties(7)
    dropped: dict[int, str] = {}
    result = run_round(MODEL, parties, SETTINGS, privacy=2, dropped=dropped)
    assert dropped == {} and result.clients == tuple(sorted(parties))
    _assert_close(result.model, _reference(parties, result.clients))


def test_a_corrupted_offline_bundle_drops_exactly_that_client() -> None:
    parties = _parties(7)
    dropped: dict[int, str] = {}

    def tamper(label: str, node: int, reply: bytes) -> bytes:
        return reply[:-3] if label == "offline" and node == 102 else reply

    result = run_round(MODEL, parties, SETTINGS, privacy=2, dropped=dropped, tamper=tamper)
    assert set(dropped) == {102} and dropped[102].startswith("offline:")
    assert 102 not in result.clients
    _assert_close(result.model, _reference(parties, result.clients))


def test_too_few_clients_fail_the_round_and_silent_clients_are_dropped() -> None:
    parties = _parties(7)

    def silent(label: str, node: int, reply: bytes) -> bytes:
        if label == "train" and node in {100, 101, 103, 104}:
            raise ClientInputError("gone")
        return reply

    with pytest.raises(RoundFailedError):
        run_round(MODEL, parties, SETTINGS, privacy=2, tamper=silent)
