"""The Flower-free SFSL round: ``SFSLServer`` through the in-process driver ``run_round``.

* the driver gives the plaintext count-weighted average of the perturbed rows (within the
  fixed point's error), and the Flower strategy's result on the same data;
* a client whose rows reply is malformed is dropped and the others' aggregate stays exact;
* the one versioned ``SFSLSettings`` record: round trip, strict decoding, validation.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.families.sfsl.messages import SFSLSettings
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.families.sfsl.psu import PSUParams
from flwr_fsl.families.sfsl.server import SFSLParty, run_round
from flwr_fsl.strategies import SFSLFedSubAvg
from tests.families.sfsl.test_strategy import MODEL, counts, real_rows, reference, row_delta, run

N = 5
SETTINGS = SFSLSettings("emb", max_count=100.0)


def _party(pid: int, rr: RRParams) -> SFSLParty:
    def train(model: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        out = {k: v.copy() for k, v in model.items()}
        for r in real_rows(pid):
            out["emb"][r] += row_delta(pid, int(r)).astype(np.float32)
        out["fc"] += np.float32(pid)
        return out, float(10 * (pid + 1))

    return SFSLParty(1000 + pid, real_rows(pid), counts(pid), rr, train)


def _parties(rr: RRParams) -> dict[int, SFSLParty]:
    return {1000 + p: _party(p, rr) for p in range(N)}


@pytest.mark.parametrize(
    "rr", [RRParams.symmetric(1, 0), RRParams.symmetric(7 / 8, 1 / 8), RRParams.symmetric(1, 1)]
)
def test_the_driver_equals_the_plaintext_count_weighted_average(rr: RRParams) -> None:
    dropped: dict[int, str] = {}
    out = run_round(MODEL, _parties(rr), SETTINGS, dropped=dropped)
    assert dropped == {} and out.clients == tuple(1000 + p for p in range(N))
    seen = {node - 1000: rows for node, rows in out.perturbed.items()}
    emb, fc = reference(range(N), seen)
    np.testing.assert_allclose(out.model["emb"], emb, atol=1e-5)
    np.testing.assert_allclose(out.model["fc"], fc, atol=1e-5)
    assert out.model["emb"].dtype == np.float32 and out.report.false_positive_rate == 0.0


def test_the_driver_equals_the_flower_strategy() -> None:
    rr = RRParams.symmetric(1, 0)  # S'' = S: both runs upload the same rows
    strategy, result, _ = run(rr)
    out = run_round(MODEL, _parties(rr), SETTINGS)
    assert strategy.reports[1]["union"] == out.union.size
    assert strategy.reports[1]["rows-updated"] == out.touched.size
    for name in MODEL:  # equal up to the fixed point's stochastic rounding
        np.testing.assert_allclose(result.arrays[name].numpy(), out.model[name], atol=1e-6)


def test_the_quantized_driver_stays_within_one_level() -> None:
    settings = SFSLSettings("emb", clip=4.0, max_count=100.0, levels=2**15)
    out = run_round(MODEL, _parties(RRParams.symmetric(1, 0)), settings)
    emb, fc = reference(range(N), {p: real_rows(p) for p in range(N)})
    np.testing.assert_allclose(out.model["emb"], emb, atol=8.0 / (2**15 - 1) + 1e-6)
    np.testing.assert_allclose(out.model["fc"], fc, atol=1e-5)


@pytest.mark.parametrize("kind", ["short", "long", "silent"])
def test_a_malformed_rows_reply_drops_its_client_and_the_others_stay_exact(kind: str) -> None:
    def tamper(label: str, node: int, reply: Any) -> Any:
        if label != "rows-train" or node != 1002:
            return reply
        if kind == "silent":
            raise ClientInputError("went silent")
        return reply[:-1] if kind == "short" else np.concatenate([reply, reply[:1]])

    dropped: dict[int, str] = {}
    rr = RRParams.symmetric(7 / 8, 1 / 8)
    out = run_round(MODEL, _parties(rr), SETTINGS, dropped=dropped, tamper=tamper)
    assert set(dropped) == {1002} and dropped[1002].startswith("rows-train")
    assert 1002 not in out.clients
    seen = {node - 1000: rows for node, rows in out.perturbed.items()}
    emb, fc = reference([0, 1, 3, 4], seen)
    np.testing.assert_allclose(out.model["emb"], emb, atol=1e-5)
    np.testing.assert_allclose(out.model["fc"], fc, atol=1e-5)


def test_a_perturbed_set_outside_the_union_drops_its_client() -> None:
    def tamper(label: str, node: int, reply: Any) -> Any:
        return np.array([10**6]) if label == "perturb" and node == 1001 else reply

    dropped: dict[int, str] = {}
    rr = RRParams.symmetric(1, 0)
    out = run_round(MODEL, _parties(rr), SETTINGS, dropped=dropped, tamper=tamper)
    assert set(dropped) == {1001} and "union" in dropped[1001]
    emb, fc = reference([0, 2, 3, 4], {p: real_rows(p) for p in range(N)})
    np.testing.assert_allclose(out.model["emb"], emb, atol=1e-5)
    np.testing.assert_allclose(out.model["fc"], fc, atol=1e-5)


# ---- the settings record ---------------------------------------------------------------------
FULL = SFSLSettings(
    "item_emb.weight", "n", 4.0, 100.0, 20, 500, 2**15, PSUParams(1000, 1440, 10, 4, bytes(16))
)


@pytest.mark.parametrize("settings", [SETTINGS, FULL], ids=["default", "full"])
def test_settings_round_trip_and_decode_strictly(settings: SFSLSettings) -> None:
    data = settings.to_bytes()
    assert data[:4] == b"FSFL" and SFSLSettings.from_bytes(data) == settings
    for cut in range(len(data)):
        with pytest.raises(WireFormatError):
            SFSLSettings.from_bytes(data[:cut])
    with pytest.raises(WireFormatError):
        SFSLSettings.from_bytes(data + b"\x00")
    with pytest.raises(WireFormatError):
        SFSLSettings.from_bytes(data[:4] + b"\x02" + data[5:])
    assert issubclass(WireFormatError, ClientInputError)


def test_settings_that_do_not_validate_are_refused_on_the_wire() -> None:
    data = SETTINGS.to_bytes()
    clip_at = 4 + 1 + 4 + 3 + 4 + len(b"num-examples")
    nan = struct.pack("<d", float("nan"))
    with pytest.raises(WireFormatError, match="invalid SFSL settings"):
        SFSLSettings.from_bytes(data[:clip_at] + nan + data[clip_at + 8 :])
    with pytest.raises(WireFormatError, match="PSU flag"):
        SFSLSettings.from_bytes(data[:-1] + b"\x02")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"clip": 0.0}, "clip"),
        ({"clip": float("inf")}, "clip"),
        ({"frac_bits": 60}, "frac_bits"),
        ({"max_count": 1e12}, "max_count"),
        ({"quantization_levels": 1}, "quantization_levels"),
        ({"weighted_by_key": ""}, "weighted_by_key"),
    ],
)
def test_the_strategy_validates_its_settings_once(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SFSLFedSubAvg("emb", **kwargs)


def test_neighbours_sparsify_the_union_round_and_keep_the_average() -> None:
    # 5 clients, neighbours=2: the union round masks on a ring; the rows round (a subset
    # round) keeps the complete graph. Same average as the complete graph.
    rr = RRParams.symmetric(1, 0)
    out = run_round(MODEL, _parties(rr), SETTINGS, threshold=2, neighbours=2)
    emb, fc = reference(range(N), {p: real_rows(p) for p in range(N)})
    np.testing.assert_allclose(out.model["emb"], emb, atol=1e-5)
    np.testing.assert_allclose(out.model["fc"], fc, atol=1e-5)


@pytest.mark.parametrize(("k", "t"), [(3, 0.6), (4, 5), (1, 0.6)])
def test_sfsl_neighbours_are_validated_before_round_one(k: int, t: float) -> None:
    with pytest.raises(ConfigurationError, match=r"neighbours|reconstruction_threshold"):
        SFSLFedSubAvg("emb", neighbours=k, reconstruction_threshold=t)
