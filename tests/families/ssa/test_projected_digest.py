"""The projected check's digest version 2 (parameter version 8) and the params' round trips.

Version 2 (:func:`~flwr_fsl.families.ssa.projected_check.public_digest_v2`, the default of a
checked round; version 1 is pinned with ``projected_digest=1``) binds the fields
that fix the value shares, hashed in pieces on threads: the same bytes for any thread count
and piece split, blind to the proof words only, and a round with it checks clients as version
1 does (honest clients reconstruct, a changed value word after the trailer is dropped).
Unchecked rounds keep their checked variant's ``projections`` / ``projected_digest`` through
``to_bytes`` / ``from_bytes``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import DPFPublicBatch
from flwr_fsl.crypto.hashing import EMPTY
from flwr_fsl.families.ssa import projected_check as pc
from flwr_fsl.families.ssa.messages import DEFAULT_PROJECTED_DIGEST
from flwr_fsl.families.ssa.protocol import SSAInputError, SSAParams, SSAUpload, encode_update
from tests.families.ssa.test_projected_check import _aggregate, _honest, _params


def _public(params: SSAParams) -> tuple[DPFPublicBatch, SSAUpload, object]:
    rng = np.random.default_rng(3)
    idx = rng.choice(params.domain_size, params.num_items, replace=False)
    vals = rng.uniform(-1, 1, size=(params.num_items, params.value_width))
    upload, state = encode_update(
        params, idx, vals, rng=rng, master_seeds=(bytes(16), bytes(range(16))), threads=1
    )
    return state.keys[0].public, upload, state


# -- parameters ----------------------------------------------------------------------------------


def test_version_8_is_the_default_and_version_7_is_pinned_by_digest_1() -> None:
    v2 = _params(projected_digest=2)
    raw = json.loads(v2.to_bytes())
    assert raw["version"] == 8 and raw["projected_digest"] == 2
    assert SSAParams.from_bytes(v2.to_bytes()) == v2
    assert _params() == v2 and _params().projected_digest == DEFAULT_PROJECTED_DIGEST == 2
    v1 = _params(projected_digest=1)
    assert json.loads(v1.to_bytes())["version"] == 7 and v1.projected_digest == 1
    assert "projected_digest" not in json.loads(v1.to_bytes())
    assert SSAParams.from_bytes(v1.to_bytes()) == v1  # version 7 bytes decode as digest 1


def test_an_unchecked_round_s_bytes_without_the_field_keep_digest_1() -> None:
    """Versions 1 to 4 keep their bytes and meaning: no field means the variant's digest 1."""
    pinned = _params(verify=False, projected_digest=1)
    assert "projected_digest" not in json.loads(pinned.to_bytes())
    assert SSAParams.from_bytes(pinned.to_bytes()) == pinned
    # A default unchecked round's checked variant is the default checked round, and says so.
    unchecked = _params(verify=False)
    assert json.loads(unchecked.to_bytes())["projected_digest"] == 2
    assert replace(SSAParams.from_bytes(unchecked.to_bytes()), verify=True) == _params()


@pytest.mark.parametrize(
    "kw",
    [
        {"projections": 8},
        {"projected_digest": 2},
        {"projections": 1024, "projected_digest": 2},
        {"projections": 8, "weighted": True, "count_weighted": False},
    ],
)
def test_an_unchecked_round_keeps_its_checked_variant_through_bytes(kw: dict) -> None:
    """Before, ``projections`` other than 64 of an unchecked round was lost in a round trip."""
    unchecked = _params(verify=False, **kw)
    back = SSAParams.from_bytes(unchecked.to_bytes())
    assert back == unchecked
    assert replace(back, verify=True) == replace(unchecked, verify=True)
    assert json.loads(unchecked.to_bytes())["version"] <= 4  # still an unchecked round's version


def test_default_settings_add_no_field_and_an_explicit_check_normalizes() -> None:
    raw = json.loads(_params(verify=False, projected_digest=1).to_bytes())
    assert "projections" not in raw and "projected_digest" not in raw
    assert "projections" not in json.loads(_params(verify=False).to_bytes())
    off = _params(value_check="off", projections=8, projected_digest=2)
    assert off.projections == 64 and off.projected_digest == 1  # unused: stored as defaults


@pytest.mark.parametrize("bad", [0, 3, True, "2", None])
def test_a_bad_projected_digest_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="projected_digest"):
        _params(projected_digest=bad)


def test_non_canonical_encodings_are_refused() -> None:
    v2 = json.loads(_params(projected_digest=2).to_bytes())
    unchecked = json.loads(_params(verify=False, projections=8).to_bytes())
    bad = [
        ({**v2, "projected_digest": 1}, "projected_digest=2 only"),
        ({**v2, "projected_digest": 5}, "projected_digest"),
        ({**v2, "projected_digest": "2"}, "wrong type"),
        ({k: v for k, v in v2.items() if k != "projected_digest"}, "fields differ"),
        ({**v2, "version": 7}, "fields differ"),
        ({**unchecked, "projections": 64}, "'projections' is written only when not 64"),
        ({**unchecked, "projected_digest": 1}, "'projected_digest' is written only when not 1"),
        ({**json.loads(_params(projected_digest=1).to_bytes()), "projected_digest": 2}, "differ"),
    ]
    for raw, match in bad:
        with pytest.raises((SSAInputError, ConfigurationError), match=match):
            SSAParams.from_bytes(json.dumps(raw).encode())


# -- the digest ----------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(piece=st.integers(1, 4096), threads=st.integers(1, 5))
def test_digest_v2_is_the_same_for_any_threads(piece: int, threads: int) -> None:
    """Same bytes on any thread count; the piece size is part of the definition (fixed)."""
    public = _PUBLIC
    want = pc.public_digest_v2(public)
    assert pc.public_digest_v2(public, threads) == want
    import unittest.mock

    with unittest.mock.patch.object(pc, "DIGEST_PIECE", piece):
        one = pc.public_digest_v2(public)
        assert pc.public_digest_v2(public, threads) == one
    assert (one == want) == (piece >= max(f.shape[0] for f in pc._binding_fields(public)))


_INIT = ("tau", "domain_bits", "epochs", "cw_seeds", "cw_bits", "cw_leaf", "cw_proof")


def _edited(public: DPFPublicBatch, name: str) -> DPFPublicBatch:
    """The batch with bit 1 of the last word of field ``name`` flipped (still a valid batch)."""
    fields = {f: getattr(public, f) for f in _INIT}
    arr = np.array(fields[name], copy=True)
    arr.reshape(-1)[-1] ^= 2
    fields[name] = arr
    return DPFPublicBatch(**fields)


def test_digest_v2_binds_every_value_field_and_not_the_proof_words() -> None:
    public = _PUBLIC
    want = pc.public_digest_v2(public)
    assert want != pc.public_digest(public)
    for name in ("epochs", "cw_seeds", "cw_bits", "cw_leaf"):  # (domain bits: other shapes)
        assert pc.public_digest_v2(_edited(public, name)) != want, name
    assert pc.public_digest_v2(_edited(public, "cw_proof")) == want  # no value share uses it
    assert pc.public_digest(_edited(public, "cw_proof")) != pc.public_digest(public)


def test_the_binding_follows_the_round() -> None:
    public = _PUBLIC
    assert pc.public_binding(_params(projected_digest=1), public) == pc.public_digest(public)
    assert pc.public_binding(_params(), public, 3) == pc.public_digest_v2(public)  # the default


# -- a round with version 2 ----------------------------------------------------------------------


def test_honest_clients_reconstruct_with_digest_v2() -> None:
    params = _params(projected_digest=2)
    uploads, sums = _honest(params, 3)
    result, dropped = _aggregate(params, uploads)
    assert dropped == set()
    np.testing.assert_allclose(result.sums, sums, atol=3 * 2.0**-params.frac_bits)  # type: ignore[attr-defined]


def _tampered(params: SSAParams, field: str) -> dict[int, SSAUpload]:
    """An honest upload with value word 0 of a real key's leaf row (or a proof word) flipped.

    The leaf row of ``_params()`` (``key_tau = 4``, one point per group) is the point's value
    words, count word and padding: the flip moves the value at the key's one point only.
    """
    public, upload, state = _public(params)
    real = int(np.flatnonzero(state.placement.slots != EMPTY)[0])  # type: ignore[attr-defined]
    lay = public.layout()
    start = lay.leaf if field == "cw_leaf" else lay.proof_at
    row = 8 * getattr(public, field).shape[1]
    blob = bytearray(upload.public_part)
    blob[start + real * row] ^= 1
    return {5: SSAUpload(bytes(blob), upload.master_seeds)}


def test_a_value_word_changed_after_the_trailer_passes_the_key_check() -> None:
    """The control: without a value check the changed word is accepted (one point, count 1)."""
    params = _params(value_check="off")
    assert _aggregate(params, _tampered(params, "cw_leaf"))[1] == set()


@pytest.mark.parametrize("digest", [1, 2])
@pytest.mark.parametrize("field", ["cw_leaf", "cw_proof"])
def test_a_word_changed_after_the_trailer_is_dropped(digest: int, field: str) -> None:
    """A value word changed after ``zseed``: the projections differ (v1, v2); proof: key check."""
    params = _params(projected_digest=digest)
    assert _aggregate(params, _tampered(params, field))[1] == {5}


_PUBLIC = _public(_params())[0]


@pytest.mark.parametrize("digest", [1, 2])
def test_the_upload_is_the_same_on_any_threads(
    monkeypatch: pytest.MonkeyPatch, digest: int
) -> None:
    """Projections and digest pieces on threads (small chunks: every split runs) change no byte."""
    monkeypatch.setattr(pc, "_CHUNK", 8)
    monkeypatch.setattr(pc, "DIGEST_PIECE", 64)
    params = _params(projected_digest=digest)
    blobs = []
    for threads in ("1", "3"):
        monkeypatch.setenv("FLWR_FSL_SSA_THREADS", threads)  # the trailer's threads
        blobs.append(_public(params)[1].public_part)
    assert blobs[0] == blobs[1]
