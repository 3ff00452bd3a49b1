"""SSA client party: the stored state's binary format, its strict decoder, the U-DPF decision."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Writer
from flwr_fsl.crypto.hashing import EMPTY, CuckooInsertionError
from flwr_fsl.families.ssa.messages import _FIELD_TYPES
from flwr_fsl.families.ssa.protocol import (
    SSAClientState,
    SSAInputError,
    SSAParams,
    SSAServer,
    SSAUpload,
    can_send_hint,
    encode_round,
    encode_update,
    held_digest,
    place_indices,
    reconstruct,
)

SEEDS = (bytes(range(16)), bytes(range(16, 32)))


def _key(n: int) -> bytes:
    return hashlib.sha256(n.to_bytes(8, "little")).digest()[:16]


def _state(
    m: int = 60, k: int = 6, width: int = 2, n: int = 4, seed: int = 0, **kw: Any
) -> tuple[SSAParams, SSAClientState]:
    params = SSAParams(
        round_id=1, domain_size=m, num_items=k, value_width=width, hash_key=_key(seed), **kw
    )
    rng = np.random.default_rng(seed)
    idx = rng.choice(m, n, replace=False)
    _, state = encode_update(
        params, idx, rng.normal(size=(n, width)), 2.0, rng=rng, master_seeds=SEEDS
    )
    return params, state


def _assert_same(a: SSAClientState, b: SSAClientState) -> None:
    assert a.params == b.params
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.placement.alphas, b.placement.alphas)
    np.testing.assert_array_equal(a.placement.slots, b.placement.slots)
    assert a.keys[0] == b.keys[0] and a.keys[1] == b.keys[1]


# ---- the format ---------------------------------------------------------------------------------


@st.composite
def states(draw: st.DrawFn) -> SSAClientState:
    m = draw(st.integers(1, 400))
    k = draw(st.integers(0, min(m, 24)))
    n = draw(st.integers(0, k))
    width = draw(st.integers(1, 4))
    kw = {
        "count_weighted": draw(st.booleans()),
        "stash_size": draw(st.integers(0, 2)),
        "epoch": draw(st.integers(0, 3)),
    }
    return _state(m, k, width, n, seed=draw(st.integers(0, 2**16)), **kw)[1]


@given(states())
def test_state_round_trips(state: SSAClientState) -> None:
    data = state.to_bytes()
    back = SSAClientState.from_bytes(data)
    _assert_same(back, state)
    assert back.to_bytes() == data


def test_hint_updated_state_round_trips() -> None:
    params, state = _state()
    state.next_round(replace(params, round_id=2, epoch=1), np.ones((4, 2)), 1.0)
    back = SSAClientState.from_bytes(state.to_bytes())
    _assert_same(back, state)
    assert back.params.epoch == 1


def test_format_header_and_layout() -> None:
    _, state = _state()
    data = state.to_bytes()
    assert data[:5] == b"FSCS\x01"
    # Fields in the documented order: the params JSON comes right after the header.
    length = int.from_bytes(data[5:9], "little")
    assert json.loads(data[9 : 9 + length])["format"] == "flwr_fsl/ssa-params"


def test_to_bytes_refuses_mismatched_key_shares() -> None:
    _, a = _state(seed=1)
    _, b = _state(seed=2)
    with pytest.raises(ValueError, match="same keys"):
        replace(a, keys=(a.keys[0], b.keys[1])).to_bytes()
    with pytest.raises(ValueError, match="same keys"):
        replace(a, keys=(a.keys[1], a.keys[0])).to_bytes()


def test_every_truncation_and_extension_is_rejected() -> None:
    _, state = _state(m=30, k=4, n=3)
    data = state.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(SSAInputError):
            SSAClientState.from_bytes(data[:cut])
    for tail in (b"\x00", b"\x01\x02\x03", data):
        with pytest.raises(SSAInputError):
            SSAClientState.from_bytes(data + tail)


def test_wrong_magic_version_and_type_are_rejected() -> None:
    _, state = _state()
    data = state.to_bytes()
    with pytest.raises(SSAInputError, match="not an SSA client state"):
        SSAClientState.from_bytes(b"XXXX" + data[4:])
    with pytest.raises(SSAInputError, match="version 2"):
        SSAClientState.from_bytes(data[:4] + b"\x02" + data[5:])
    with pytest.raises(SSAInputError, match="bytes"):
        SSAClientState.from_bytes("FSCS")  # type: ignore[arg-type]


def _encode(state: SSAClientState, **override: Any) -> bytes:
    """Re-encode a state field by field, with some fields replaced (raw bytes or arrays)."""
    fields: dict[str, Any] = {
        "params": state.params.to_bytes(),
        "indices": state.indices,
        "alphas": state.placement.alphas,
        "slots": state.placement.slots,
        "public": state.keys[0].public.to_bytes(),
        "seeds0": state.keys[0].root_seeds,
        "seeds1": state.keys[1].root_seeds,
        **override,
    }
    w = Writer()
    w.fixed(b"FSCS", 4)
    w.u8(1)
    for name in ("params", "indices", "alphas", "slots", "public", "seeds0", "seeds1"):
        (w.raw if name in ("params", "public") else w.array)(fields[name])
    return w.payload()


def _inconsistent_cases() -> dict[str, tuple[Any, str]]:
    params, state = _state(m=60, k=6, n=4)
    idx, alphas, slots = state.indices, state.placement.alphas, state.placement.slots
    used = np.flatnonzero(slots != EMPTY)
    swapped = slots.copy()
    swapped[used[0]] = EMPTY  # one index is carried by no key
    doubled = slots.copy()
    doubled[used[0]] = slots[used[1]]
    far = alphas.copy()
    far[used[0]] = np.uint64(2**62)
    low_bit = state.keys[0].root_seeds.copy()
    low_bit[0, 0] |= np.uint64(1)
    return {
        "identity": ({}, ""),
        "index outside the domain": ({"indices": np.array([*idx[:3], 12345])}, "domain"),
        "repeated index": ({"indices": np.array([*idx[:3], idx[0]])}, "repeated"),
        "too many indices": ({"indices": np.arange(7)}, "more indices"),
        "indices of another dtype": ({"indices": idx.astype(np.uint64)}, "malformed"),
        "2-D slots": ({"slots": slots.reshape(1, -1)}, "malformed"),
        "slot missing": ({"slots": swapped}, "exactly once"),
        "slot doubled": ({"slots": doubled}, "exactly once"),
        "short alphas": ({"alphas": alphas[:-1]}, "key count"),
        "point outside its domain": ({"alphas": far}, "domain"),
        "seed with its low bit set": ({"seeds0": low_bit}, "malformed keys"),
        "seeds of another shape": ({"seeds1": low_bit[:-1]}, "malformed keys"),
        "public part garbage": ({"public": b"FDPF" + bytes(40)}, "malformed keys"),
        "params of another epoch": (
            {"params": replace(params, epoch=1).to_bytes()},
            "tau or epoch",
        ),
        "params of another width": (
            {"params": replace(params, value_width=4).to_bytes()},
            "tau or epoch",
        ),
        "params not JSON": ({"params": b"{"}, "bad round parameters"),
        "params with a NaN": (
            {"params": state.params.to_bytes().replace(b"10000.0", b"NaN")},
            "bad round parameters",
        ),
    }


CASES = _inconsistent_cases()


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_fields_are_rejected_without_secrets(case: str) -> None:
    _, state = _state(m=60, k=6, n=4)
    override, match = CASES[case]
    data = _encode(state, **override)
    if not match:
        _assert_same(SSAClientState.from_bytes(data), state)
        return
    with pytest.raises(SSAInputError, match=match) as info:
        SSAClientState.from_bytes(data)
    text = str(info.value)
    assert "12345" not in text and not any(str(int(i)) in text.split() for i in state.indices)


def test_huge_declared_lengths_fail_before_allocating() -> None:
    w = Writer()
    w.fixed(b"FSCS", 4)
    w.u8(1)
    w.u32(2**32 - 1)  # params "length"
    with pytest.raises(SSAInputError, match="malformed"):
        SSAClientState.from_bytes(w.payload() + b"{}")
    _, state = _state()
    head = _encode(state)[: 9 + len(state.params.to_bytes())]
    # indices: int64, 1-D, 2**60 elements declared, 8 bytes present.
    bomb = head + bytes([2, 1]) + (2**60).to_bytes(8, "little") + bytes(8)
    with pytest.raises(SSAInputError, match="malformed"):
        SSAClientState.from_bytes(bomb)


@given(st.binary(max_size=300))
def test_fuzz_random_bytes_raise_only_the_input_error(data: bytes) -> None:
    for blob in (data, b"FSCS\x01" + data):
        try:
            SSAClientState.from_bytes(blob)
        except SSAInputError:
            pass


VALID = _state(m=40, k=5, n=3, seed=5)[1].to_bytes()


@given(st.integers(0, len(VALID) - 1), st.integers(1, 255), st.integers(0, 3))
def test_fuzz_mutations_raise_only_the_input_error(pos: int, xor: int, mode: int) -> None:
    if mode == 0:  # flip bits in one byte
        blob = VALID[:pos] + bytes([VALID[pos] ^ xor]) + VALID[pos + 1 :]
    elif mode == 1:  # delete a run of bytes
        blob = VALID[:pos] + VALID[pos + xor :]
    elif mode == 2:  # insert bytes
        blob = VALID[:pos] + bytes([xor]) * (xor % 9 + 1) + VALID[pos:]
    else:  # overwrite with a byte pattern
        blob = VALID[:pos] + bytes([xor]) * 8 + VALID[pos + 8 :]
    try:
        state = SSAClientState.from_bytes(blob)
    except SSAInputError:
        return
    state.to_bytes()  # what decodes is a consistent state


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@given(st.dictionaries(st.sampled_from(sorted(_FIELD_TYPES)), JSON_VALUES, min_size=1))
def test_fuzz_params_fields_raise_only_value_errors(changes: dict[str, Any]) -> None:
    params, state = _state(m=40, k=5, n=3, seed=5)
    raw = json.loads(params.to_bytes())
    raw.update(changes)
    text = json.dumps(raw).encode()
    try:
        SSAParams.from_bytes(text)
    except ValueError:
        pass
    try:
        SSAClientState.from_bytes(_encode(state, params=text))
    except SSAInputError:
        pass


def test_params_decoder_checks_types_of_every_field() -> None:
    # "range_check" is version 6's field (value_check="exact"), not a dataclass field.
    assert set(_FIELD_TYPES) == set(SSAParams.__dataclass_fields__) | {"range_check"}
    params, _ = _state()
    raw = json.loads(params.to_bytes())
    for name, bad in [("domain_size", True), ("num_hashes", 3.0), ("count_weighted", 1)]:
        with pytest.raises(SSAInputError, match=name):
            SSAParams.from_bytes(json.dumps({**raw, name: bad}).encode())
    for constant in (b"Infinity", b"NaN", b"-Infinity"):
        with pytest.raises(SSAInputError, match="not a valid"):
            SSAParams.from_bytes(params.to_bytes().replace(b"10000.0", constant))
    # Integers are accepted for the float fields.
    assert SSAParams.from_bytes(json.dumps({**raw, "max_abs": 100}).encode()).max_abs == 100


# ---- errors do not leak the client's secrets ---------------------------------------------------


def test_client_errors_name_no_index_value_or_set_size() -> None:
    params = SSAParams(round_id=1, domain_size=500, num_items=16, value_width=1, hash_key=_key(1))
    cases = [
        (np.arange(317, 334), np.ones(17), ["17", "317"]),  # too many: n and indices
        (np.array([421, 421]), np.ones(2), ["421"]),  # repeated index
        (np.array([3, 777]), np.ones(2), ["777"]),  # out of the domain
        (np.array([3, 4]), np.array([1.0, 98765.0]), ["98765"]),  # value above max_abs
        (np.array([3, 4]), np.ones(3), ["3 "]),  # rows and indices differ in number
    ]
    for idx, values, secrets in cases:
        with pytest.raises(ConfigurationError) as info:
            encode_update(params, idx, values, 1.0)
        assert not any(s in str(info.value) for s in secrets), str(info.value)
    with pytest.raises(ConfigurationError, match="one per value row") as info:
        encode_update(params, np.array([3, 4, 5]), np.ones(3), np.ones(4))
    assert not any(c.isdigit() for c in str(info.value))


def test_cuckoo_failure_names_no_index() -> None:
    # Load factor 1 with three hashes and no stash: insertion fails (far above the threshold).
    params = SSAParams(
        round_id=1,
        domain_size=5000,
        num_items=400,
        value_width=1,
        hash_key=_key(3),
        scale_factor=1.0,
    )
    with pytest.raises(CuckooInsertionError, match="cuckoo hashing failed") as info:
        place_indices(params, np.arange(1000, 1400))
    assert not any(c.isdigit() for c in str(info.value))
    assert 1000 <= info.value.index < 1400  # kept on the object, out of the text


# ---- the U-DPF decision -------------------------------------------------------------------------


def test_fresh_keys_without_udpf_or_previous_state() -> None:
    params, state = _state()
    later = replace(params, round_id=2, epoch=1)
    values = np.ones((4, 2))
    out, new = encode_round(later, state.indices, values, 1.0, None, udpf=True)
    assert isinstance(out, SSAUpload) and new.params == later
    out, new = encode_round(later, state.indices, values, 1.0, state, udpf=False)
    assert isinstance(out, SSAUpload) and new.params == later


@pytest.mark.parametrize(
    ("change", "hint"),
    [
        ({"epoch": 1}, True),
        ({"epoch": 1, "round_id": 9, "frac_bits": 20, "max_abs": 10.0}, True),  # not layout
        ({"epoch": 0}, False),  # not a later epoch
        ({"epoch": 1, "hash_key": _key(99)}, False),
        ({"epoch": 1, "value_width": 3}, False),
        ({"epoch": 1, "num_items": 7}, False),
        ({"epoch": 1, "stash_size": 1}, False),
        ({"epoch": 1, "count_weighted": False}, False),
    ],
)
def test_hint_iff_later_epoch_and_same_layout(change: dict[str, Any], hint: bool) -> None:
    params, state = _state()
    later = replace(params, **{"round_id": 2, **change})
    width = later.value_width
    before = state.to_bytes()
    held = held_digest(state.keys[0])  # the servers hold exactly this client's keys
    out, new = encode_round(
        later, state.indices, np.ones((4, width)), 1.0, state, udpf=True, held=held
    )
    assert isinstance(out, bytes) is hint
    assert can_send_hint(state, later, state.indices, held) is hint
    assert new.params == later
    assert state.to_bytes() == before  # the previous state is not modified


def test_other_index_array_gets_fresh_keys() -> None:
    params, state = _state()
    later = replace(params, round_id=2, epoch=1)
    other_order = state.indices[::-1]
    other_set = np.array([*state.indices[:3], (state.indices[3] + 1) % 60])
    for idx in (other_order, other_set, state.indices[:3]):
        if len(set(idx.tolist())) != idx.size:
            continue
        out, new = encode_round(
            later,
            idx,
            np.ones((idx.size, 2)),
            1.0,
            state,
            udpf=True,
            held=held_digest(state.keys[0]),
        )
        assert isinstance(out, SSAUpload)
        np.testing.assert_array_equal(new.indices, idx)


def test_fresh_keys_equal_encode_update_bytes() -> None:
    params, state = _state()
    values = np.random.default_rng(1).normal(size=(4, 2))
    a, sa = encode_round(
        params, state.indices, values, 2.0, rng=np.random.default_rng(4), master_seeds=SEEDS
    )
    b, sb = encode_update(
        params, state.indices, values, 2.0, rng=np.random.default_rng(4), master_seeds=SEEDS
    )
    assert isinstance(a, SSAUpload) and a.public_part == b.public_part
    assert sa.to_bytes() == sb.to_bytes()


def test_hints_from_stored_states_reconstruct_the_aggregate() -> None:
    """Three rounds: fresh keys, then hints from states that went through to_bytes/from_bytes."""
    base = SSAParams(round_id=1, domain_size=200, num_items=12, value_width=3, hash_key=_key(4))
    rng = np.random.default_rng(8)
    idx = [rng.choice(200, 5 + c, replace=False) for c in range(3)]
    stored: dict[int, bytes] = {}
    keys: list[dict] = [{}, {}]
    for epoch in range(1, 4):  # U-DPF epochs start at 1 (epoch-0 keys are not kept)
        params = replace(base, round_id=epoch, epoch=epoch)
        servers = [SSAServer(params, b, keys[b]) for b in (0, 1)]
        sums, counts = np.zeros((200, 3)), np.zeros(200)
        for c in range(3):
            values = np.random.default_rng([epoch, c]).normal(size=(idx[c].size, 3))
            weights = np.arange(1.0, idx[c].size + 1)  # per-row counts
            previous = SSAClientState.from_bytes(stored[c]) if c in stored else None
            held = held_digest(keys[0][c]) if c in keys[0] else None  # what S0 announces
            out, state = encode_round(
                params, idx[c], values, weights, previous, udpf=True, held=held
            )
            stored[c] = state.to_bytes()
            assert isinstance(out, bytes) is (epoch > 1)
            for b in (0, 1):
                if isinstance(out, bytes):
                    servers[b].add_client_hint(c, out)
                else:
                    servers[b].add_client(c, out.public_part, out.master_seeds[b])
            sums[idx[c]] += weights[:, None] * values
            counts[idx[c]] += weights
        keys = [servers[0].keys, servers[1].keys]
        got = reconstruct(params, servers[0].share(), servers[1].share())
        np.testing.assert_allclose(got.sums, sums, atol=1e-4)
        assert got.counts is not None
        np.testing.assert_allclose(got.counts, counts, atol=1e-4)


def test_no_hint_unless_the_servers_hold_exactly_these_keys() -> None:
    # Issue 8 item 3: a hint applied to other keys writes pseudorandom values at the client's
    # old rows. The client hints only against the digest S0 announces.
    params, state = _state()
    later = replace(params, round_id=2, epoch=1)
    values = np.ones((4, later.value_width))
    other_state = encode_update(params, state.indices, values, 1.0)[1]
    for held in (None, b"", bytes(32), held_digest(other_state.keys[0])):
        out, _ = encode_round(later, state.indices, values, 1.0, state, udpf=True, held=held)
        assert isinstance(out, SSAUpload)
        assert not can_send_hint(state, later, state.indices, held)
    out, _ = encode_round(
        later, state.indices, values, 1.0, state, udpf=True, held=held_digest(state.keys[0])
    )
    assert isinstance(out, bytes)
