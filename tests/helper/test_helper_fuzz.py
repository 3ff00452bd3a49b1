"""Hypothesis fuzz over S1's wire decoders and round parameters (issue 24 item 7).

Whatever bytes a caller sends, S1 answers with a refusal
(:class:`~flwr_fsl.helper.errors.HelperRequestError`, gRPC ``INVALID_ARGUMENT`` and
siblings), never an internal error: every registered request decoder raises only
:class:`~flwr_fsl.helper.errors.WireFormatError`, and ``OpenRound`` parameters — nested
objects, ``scale_factor = 1e308``, infinities (JSON ``1e999``), huge integers in any field —
are refused at the decoder with the field named.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import DistributedDP, RunScope
from flwr_fsl.families.ssa.messages import SSAParams
from flwr_fsl.helper import (
    HelperClient,
    HelperError,
    HelperRequestError,
    HelperService,
    start_server,
    wire,
)
from flwr_fsl.helper.errors import WireFormatError
from flwr_fsl.helper.services.psu import PsuSumRequest, SeedItem

SERVICE = HelperService(SealingKeyPair.generate())
SID = bytes(range(16))
ITEM = wire.SealedItem(7, b"public", b"sealed")
SAMPLES: list[wire.Message] = [
    wire.HealthRequest(),
    wire.PublicKeyRequest(),
    wire.OpenSessionRequest(),
    wire.CloseSessionRequest(SID),
    wire.OpenRoundRequest(SID, 3, b'{"format": 1}'),
    wire.OpenCheckedRoundRequest(SID, 3, b'{"format": 1}', bytes(range(1, 17))),
    wire.AddClientsRequest(SID, 3, (ITEM, ITEM)),
    wire.PsrAnswerRequest(SID, 3, (ITEM,)),
    wire.AddHintsRequest(SID, 3, (wire.HintItem(1, b"hint", b"sealed"),)),
    wire.SetModelRequest(SID, 3, np.arange(6, dtype=np.uint64).reshape(3, 2)),
    wire.FinishRoundRequest(SID, 3),
    wire.AbortRoundRequest(SID, 3),
    wire.AddCheckedRequest(SID, 3, (wire.CheckedItem(1, b"b", b"s", b"d" * 32),)),
    wire.AddCheckedHintsRequest(SID, 3, (wire.CheckedItem(1, b"b", b"s", b"d" * 32),)),
    PsuSumRequest(SID, 3, b"p" * 50, (SeedItem(1, b"s" * 72),)),
]
METHODS = sorted(SERVICE.methods)


def test_every_method_has_a_sample() -> None:
    assert {type(m) for m in SAMPLES} == set(SERVICE.methods.values())


@st.composite
def mutated(draw: st.DrawFn) -> tuple[type[wire.Message], bytes]:
    """A registered request's valid encoding, flipped, truncated, extended or spliced."""
    message = draw(st.sampled_from(SAMPLES))
    data = bytearray(wire.encode(message))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "extend", "splice"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif op == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif op == "extend":
            data += draw(st.binary(max_size=16))
        else:
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=9))
    expected = draw(st.sampled_from([type(message), *SERVICE.methods.values()]))
    return expected, bytes(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated())
def test_wire_decoders_raise_only_wire_format_errors(
    case: tuple[type[wire.Message], bytes],
) -> None:
    expected, data = case
    try:
        decoded = wire.decode(data, expected)
    except WireFormatError:
        return
    assert isinstance(decoded, expected)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(METHODS), data=st.binary(max_size=200) | mutated().map(lambda c: c[1])
)
def test_any_bytes_to_any_method_are_refused_never_internal(method: str, data: bytes) -> None:
    try:
        SERVICE.handle(method, data, secret=b"\0" * 32)
    except HelperRequestError:
        pass


# ---- OpenRound parameters -----------------------------------------------------------------------

BASE = json.loads(
    SSAParams(
        1, 64, 8, 1, b"k" * 16, dp=DistributedDP(1.0, 1.0, 1.0), run=RunScope("run-1")
    ).to_bytes()
)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.sampled_from([1e308, -1e308, 5e-324, 2.0**62, 2.0**64]),
    st.text(max_size=8),
)
json_tree = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


PARAMS_SERVICE = HelperService(SealingKeyPair.generate())  # its sessions are all closed again


def open_round(raw: bytes) -> None:
    """``OpenRound`` with ``raw`` in a fresh session (opened for sure, closed after)."""
    svc = PARAMS_SERVICE
    response = svc.handle("OpenSession", wire.encode(wire.OpenSessionRequest()))
    info = wire.decode(response, wire.SessionInfoResponse)
    try:
        svc.handle(
            "OpenRound", wire.encode(wire.OpenRoundRequest(info.session, 1, raw)), info.secret
        )
    finally:
        close = wire.encode(wire.CloseSessionRequest(info.session))
        svc.handle("CloseSession", close, info.secret)


def _dumps(raw: Any) -> bytes:
    # json.dumps writes inf as "Infinity" (refused as a constant); write it as 1e999 instead,
    # which Python's parser reads as inf, to reach the range checks.
    return json.dumps(raw).replace("Infinity", "1e999").encode()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(
        sorted(BASE) + [f"dp.{k}" for k in BASE["dp"]] + ["run.id", "run.epsilon", "run.delta"]
    ),
    value=json_tree,
)
def test_fuzzed_round_parameters_are_refused_never_internal(path: str, value: Any) -> None:
    raw = json.loads(json.dumps(BASE))
    *outer, last = path.split(".")
    target = raw[outer[0]] if outer else raw
    if path in ("run.epsilon", "run.delta"):
        target.setdefault("epsilon", 1.0)
        target.setdefault("delta", 1e-5)
    target[last] = value
    try:
        open_round(_dumps(raw))
    except HelperRequestError as err:
        assert "bad round parameters" in str(err) or "round" in str(err), err


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("scale_factor", 1e308, "scale_factor"),
        ("scale_factor", float("inf"), "scale_factor"),
        ("max_abs", float("inf"), "max_abs"),
        ("dp.noise_multiplier", 1e308, "dp.noise_multiplier"),
        ("dp.clip_norm", float("inf"), "dp.clip_norm"),
        ("run.epsilon", 1e308, "run.epsilon"),
        ("domain_size", 2**70, "domain_size"),
        ("num_items", 0, "num_items"),  # a DP round with no item: its sensitivity is per item
        ("dp", {"noise_multiplier": {"a": [1]}}, "dp"),
        ("run", {"id": {"nested": {"x": 1}}}, "run"),
    ],
)
def test_the_issues_parameters_are_invalid_argument_naming_the_field(
    path: str, value: Any, named: str
) -> None:
    """Over gRPC: INVALID_ARGUMENT (HelperRequestError), never INTERNAL, naming the field."""
    raw = json.loads(json.dumps(BASE))
    *outer, last = path.split(".")
    target = raw[outer[0]] if outer else raw
    if path == "run.epsilon":
        target["delta"] = 1e-5
    target[last] = value
    server, port = start_server(PARAMS_SERVICE, "127.0.0.1", 0, insecure=True)
    client = HelperClient(f"127.0.0.1:{port}", timeout=60)
    try:
        with pytest.raises(HelperRequestError, match=named) as info:
            client.open_round(1, _dumps(raw))
        assert "INTERNAL" not in str(info.value)
        assert type(info.value) is not HelperError
    finally:
        client.close()
        server.stop(0)
