"""Secure top-k with mega-elements (issue 22 item 2): rows of grouped tensors + coordinates.

``SecureFedSubAvg(groups=...)`` + ``ssa_mod`` + ``topk_mod`` equals plaintext top-k
``FedSubAvg`` with the same ``topk-groups`` (up to fixed-point error); the
:class:`MegaLayout` round-trips; honest padded keys pass both servers' key checks; the server
learns the public sizes only.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.protocol import SSAParams, SSAServer, encode_update, reconstruct
from flwr_fsl.families.ssa.verify import same_digest
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.submodel import (
    SubmodelUpdate,
    TopKConfig,
    apply_count_weighted,
    count_weighted_average,
    sparsify,
)
from flwr_fsl.submodel.mega_layout import MegaLayout
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, make_app, model_record, unit_weight_mod

GROUPS = ("conv.weight", "emb.weight")  # rows of width 20 and 4; fc.bias as coordinates
RATIO = 0.3


def _secure(groups: tuple[str, ...] = GROUPS, rounds: int = 2, feedback: bool = False):  # type: ignore[no-untyped-def]
    key = SealingKeyPair.generate()
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": feedback}
    grid = InProcessGrid(make_app([ssa_mod, topk_mod]), 4, run_config)
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key),
        topk_ratio=RATIO,
        helper_fingerprint=key.fingerprint,
        min_available_nodes=4,
        frac_bits=32,
        max_abs=1e3,
        groups=groups,
        dp=None,  # exact: the reconstruction, not the default noise
    )
    return strategy, strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=rounds)


def _plain(groups: tuple[str, ...] = GROUPS, rounds: int = 2, feedback: bool = False):  # type: ignore[no-untyped-def]
    run_config = {
        "topk-ratio": RATIO,
        "topk-groups": ",".join(groups),
        "topk-error-feedback": feedback,
    }
    grid = InProcessGrid(make_app([unit_weight_mod, topk_mod]), 4, run_config)
    # No per-coordinate clip (FedSubAvg's default 8.0): the secure strategy has none.
    strategy = FedSubAvg(min_available_nodes=4, clipping_range=None)
    return strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=rounds)


@pytest.mark.parametrize("feedback", [False, True], ids=["no-error-feedback", "error-feedback"])
def test_secure_mega_elements_equal_plaintext_topk_with_the_same_groups(feedback: bool) -> None:
    strategy, secure = _secure(rounds=3, feedback=feedback)
    plain = _plain(rounds=3, feedback=feedback)
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}, 2: {}, 3: {}}
    changed = 0
    for name, value in MODEL.items():
        got = secure.arrays[name].numpy()
        if value.dtype == np.float32:
            np.testing.assert_allclose(got, plain.arrays[name].numpy(), atol=1e-6, err_msg=name)
            changed += int(not np.array_equal(got, value))
        else:
            np.testing.assert_array_equal(got, value)
    assert changed == 3
    # Whole rows moved: a grouped tensor's rows are either all changed or all unchanged.
    for name in GROUPS:
        rows = secure.arrays[name].numpy().reshape(MODEL[name].shape[0], -1)
        moved = rows != MODEL[name].reshape(rows.shape)
        assert np.all(moved.all(axis=1) | ~moved.any(axis=1)), name


def test_round_parameters_are_the_public_sizes_only() -> None:
    strategy, _ = _secure(rounds=1)
    layout = strategy.layout(MODEL)
    assert isinstance(layout, MegaLayout)
    assert (layout.size, layout.width) == (3 + 12 + 7, 20)
    # k = ceil(r * rows) per group + ceil(r * coordinates) of the rest: what topk_mod keeps.
    assert strategy.round_items(layout) == sum(math.ceil(RATIO * n) for n in (3, 12, 7))


def test_a_flat_round_still_refuses_rows() -> None:
    # Without groups the old behaviour holds (test_mod checks the reason); a bad group name
    # is refused by name at the first round.
    with pytest.raises(ConfigurationError, match="groups"):
        SecureFedSubAvg(InProcessHelper(), topk_ratio=0.1, groups="emb.weight")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="nope"):
        MegaLayout.of(MODEL, ["nope"])


# -- Flower-free: the layout and the protocol over random widths and k ------------------------


def _model(rng: np.random.Generator, widths: list[int], rows: list[int], rest: int):  # type: ignore[no-untyped-def]
    model = {
        f"g{i}": rng.normal(size=(r, w)) for i, (w, r) in enumerate(zip(widths, rows, strict=True))
    }
    model["rest"] = rng.normal(size=rest)
    return model


shapes = st.tuples(
    st.lists(st.integers(1, 9), min_size=1, max_size=3),  # group widths
    st.integers(2, 12),  # rows per group
    st.integers(1, 15),  # rest coordinates
    st.floats(0.05, 1.0),  # ratio
    st.integers(0, 2**32 - 1),  # seed
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes)
def test_secure_mega_round_equals_plaintext_over_random_widths_and_k(case) -> None:  # type: ignore[no-untyped-def]
    widths, nrows, rest, ratio, seed = case
    rng = np.random.default_rng(seed)
    model = _model(rng, widths, [nrows] * len(widths), rest)
    groups = tuple(n for n in model if n.startswith("g"))
    layout = MegaLayout.of(model, groups)
    config = TopKConfig(ratio=ratio, groups=groups, error_feedback=False)
    updates = [
        sparsify({n: rng.normal(size=a.shape) for n, a in model.items()}, config)[0]
        for _ in range(3)
    ]
    k = sum(min(n, math.ceil(ratio * n)) for n in layout.group_sizes().values())
    params = SSAParams(
        round_id=1,
        domain_size=layout.size,
        num_items=k,
        value_width=layout.width,
        hash_key=rng.bytes(16),
        frac_bits=32,
        max_abs=1e3,
        weighted=False,
        verify=True,
    )
    servers = [SSAServer(params, 0), SSAServer(params, 1)]
    for cid, update in enumerate(updates):
        el = layout.elements(update)
        assert el.indices.size <= k
        upload, _ = encode_update(params, el.indices, el.values, el.counts, rng=rng)
        d0 = servers[0].add_client(cid, upload.public_part, upload.master_seeds[0])
        d1 = servers[1].add_client(cid, upload.public_part, upload.master_seeds[1], expect=d0)
        assert same_digest(d0, d1)  # honest padded keys pass the key check (count word 1)
    result = reconstruct(params, servers[0].share(), servers[1].share())
    assert result.counts is not None
    secure = apply_count_weighted(model, layout, result.sums, result.counts)
    plain = count_weighted_average(model, [SubmodelUpdate(u.tensors, 1.0) for u in updates])[0]
    for name in model:
        np.testing.assert_allclose(secure[name], plain[name], atol=1e-6, err_msg=name)


@settings(max_examples=30, deadline=None)
@given(shapes)
def test_mega_layout_gather_write_round_trip(case) -> None:  # type: ignore[no-untyped-def]
    widths, nrows, rest, _, seed = case
    rng = np.random.default_rng(seed)
    model = _model(rng, widths, [nrows] * len(widths), rest)
    layout = MegaLayout.of(model, [n for n in model if n.startswith("g")])
    everything = layout.gather(model)
    assert everything.shape == (layout.size, max(widths))
    zeros = {n: np.zeros_like(a) for n, a in model.items()}
    back = layout.write(zeros, np.arange(layout.size), everything + 0.0)
    for name in model:
        np.testing.assert_array_equal(back[name], model[name])
    # Padding columns are never written: garbage there changes nothing.
    noisy = everything.copy()
    for name in model:
        i = layout.names.index(name)
        noisy[layout.offsets[i] : layout.offsets[i + 1], layout.row_width(name) :] = 99.0
    back = layout.write(zeros, np.arange(layout.size), noisy)
    for name in model:
        np.testing.assert_array_equal(back[name], model[name])
