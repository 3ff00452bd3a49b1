"""PSR client state: round trip, strict decoder (fuzzed), reading the answers with it."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.wireformat import Writer
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.hashing import EMPTY
from flwr_fsl.families.ssa.protocol import SSAInputError, SSAParams
from flwr_fsl.families.ssa.psr import (
    PSRClientState,
    PSRServer,
    decode_table,
    encode_table,
    make_query,
)

ANSWER_KEY = SealingKeyPair.from_private_bytes(bytes(range(32)))


def _params(m: int = 80, k: int = 6, width: int = 3, round_id: int = 4) -> SSAParams:
    key = hashlib.sha256(b"psr-state").digest()[:16]
    return SSAParams(round_id=round_id, domain_size=m, num_items=k, value_width=width, hash_key=key)


def _state(
    params: SSAParams, n: int, seed: int = 0, counts: bool = True
) -> tuple[PSRClientState, Any]:
    rng = np.random.default_rng(seed)
    idx = rng.choice(params.domain_size, n, replace=False)
    query = make_query(params, idx, rng=rng)
    weights = rng.integers(1, 5, size=n).astype(np.float64) if counts else None
    state = PSRClientState(
        params.round_id, query.indices, query.placement.slots, ANSWER_KEY, weights
    )
    return state, query


def _same(a: PSRClientState, b: PSRClientState) -> None:
    assert a.round_id == b.round_id
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.slots, b.slots)
    assert a.answer_key.public_bytes == b.answer_key.public_bytes
    assert (a.counts is None) == (b.counts is None)
    if a.counts is not None:
        np.testing.assert_array_equal(a.counts, b.counts)


@given(
    m=st.integers(1, 300),
    frac=st.floats(0, 1),
    counts=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_round_trips(m: int, frac: float, counts: bool, seed: int) -> None:
    k = max(1, int(frac * min(m, 20)))
    params = _params(m, k)
    state, _ = _state(params, int(frac * k), seed, counts)
    data = state.to_bytes()
    assert data[:5] == b"FSPQ\x01"
    back = PSRClientState.from_bytes(data)
    _same(back, state)
    assert back.to_bytes() == data


def test_rows_reads_both_answers() -> None:
    params = _params()
    table = np.random.default_rng(1).normal(size=(80, 3)).astype(np.float32)
    state, query = _state(params, 5)
    words = encode_table(table)
    a0, a1 = (
        PSRServer(params, b, words).answer(query.upload.public_part, query.upload.master_seeds[b])
        for b in (0, 1)
    )
    state = PSRClientState.from_bytes(state.to_bytes())
    rows = decode_table(state.rows(params, a0.tobytes(), a1))
    np.testing.assert_array_equal(rows, table[state.indices])
    with pytest.raises(SSAInputError, match="not for this round"):
        state.rows(_params(round_id=5), a0.tobytes(), a1)
    with pytest.raises(SSAInputError, match="S0's answer"):
        state.rows(params, a0.tobytes()[:-8], a1)
    with pytest.raises(SSAInputError, match="S1's answer"):
        state.rows(params, a0.tobytes(), a1[:, :2])


def test_every_truncation_and_extension_is_rejected() -> None:
    state, _ = _state(_params(), 4)
    data = state.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(SSAInputError):
            PSRClientState.from_bytes(data[:cut])
    for tail in (b"\x00", data):
        with pytest.raises(SSAInputError):
            PSRClientState.from_bytes(data + tail)
    with pytest.raises(SSAInputError, match="version 7"):
        PSRClientState.from_bytes(data[:4] + b"\x07" + data[5:])


def _encode(state: PSRClientState, flag: int = 1, **override: Any) -> bytes:
    f = {"indices": state.indices, "slots": state.slots, "counts": state.counts, **override}
    w = Writer()
    w.fixed(b"FSPQ", 4)
    w.u8(1)
    w.u64(state.round_id)
    w.fixed(bytes(range(32)), 32)
    w.array(f["indices"])
    w.array(f["slots"])
    w.u8(flag)
    if f["counts"] is not None:
        w.array(f["counts"])
    return w.payload()


def _cases() -> dict[str, tuple[dict[str, Any], int, str]]:
    state, _ = _state(_params(), 4)
    used = np.flatnonzero(state.slots != EMPTY)
    lost = state.slots.copy()
    lost[used[0]] = EMPTY
    return {
        "negative index": ({"indices": np.array([-3, 1, 2, 4])}, 1, "non-negative"),
        "repeated index": ({"indices": np.array([1, 1, 2, 4])}, 1, "distinct"),
        "slot lost": ({"slots": lost}, 1, "exactly once"),
        "zero count": ({"counts": np.array([1.0, 0.0, 2.0, 3.0])}, 1, "counts"),
        "nan count": ({"counts": np.array([1.0, np.nan, 2.0, 3.0])}, 1, "counts"),
        "short counts": ({"counts": np.ones(3)}, 1, "counts"),
        "int counts": ({"counts": np.ones(4, np.int64)}, 1, "malformed"),
        "bad flag": ({}, 2, "malformed"),
        "flag without counts": ({"counts": None}, 1, "malformed"),
    }


CASES = _cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_fields_are_rejected(case: str) -> None:
    state, _ = _state(_params(), 4)
    override, flag, match = CASES[case]
    with pytest.raises(SSAInputError, match=match):
        PSRClientState.from_bytes(_encode(state, flag, **override))


VALID = _state(_params(), 4)[0].to_bytes()


@given(st.integers(0, len(VALID) - 1), st.integers(1, 255), st.booleans())
def test_fuzz_mutations_raise_only_the_input_error(pos: int, xor: int, delete: bool) -> None:
    if delete:
        blob = VALID[:pos] + VALID[pos + xor :]
    else:
        blob = VALID[:pos] + bytes([VALID[pos] ^ xor]) + VALID[pos + 1 :]
    try:
        PSRClientState.from_bytes(blob).to_bytes()
    except SSAInputError:
        pass


@given(st.binary(max_size=200))
def test_fuzz_random_bytes_raise_only_the_input_error(data: bytes) -> None:
    for blob in (data, b"FSPQ\x01" + data):
        try:
            PSRClientState.from_bytes(blob)
        except SSAInputError:
            pass
