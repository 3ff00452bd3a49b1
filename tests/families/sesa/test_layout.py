"""SESA shard groups (flwr_fsl.families.sesa.layout): every coordinate in exactly one group,
shard deltas read the narrow model's coordinates, apply is the count-weighted average, and
client-chosen shard sets and descriptors are validated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.sesa.layout import SesaLayout, check_selection, group_slots

MLP = {
    "fc1.weight": np.arange(48, dtype=np.float32).reshape(8, 6),
    "fc1.bias": np.zeros(8, np.float32),
    "fc2.weight": np.arange(24, dtype=np.float32).reshape(3, 8),
    "fc2.bias": np.ones(3, np.float32),
}
CONV = {  # conv(4 ch) -> conv(8 ch) -> flatten 2x2 -> linear(3), with BN extras and a counter
    "c1.weight": np.ones((4, 1, 3, 3), np.float32),
    "c1.bias": np.zeros(4, np.float32),
    "bn1.weight": np.ones(4, np.float32),
    "bn1.bias": np.zeros(4, np.float32),
    "bn1.num_batches_tracked": np.array(0, np.int64),
    "c2.weight": np.ones((8, 4, 3, 3), np.float32),
    "c2.bias": np.zeros(8, np.float32),
    "fc.weight": np.ones((3, 32), np.float32),
    "fc.bias": np.zeros(3, np.float32),
}


def test_mlp_groups_are_hidden_node_shards_and_the_output_bias() -> None:
    layout = SesaLayout.of(MLP, 4)
    assert layout.descriptors == ("node:fc1", "common")
    node, common = layout.groups
    assert (node.shards, node.length) == (4, 2 * 6 + 2 + 3 * 2)
    # Shard 1 = hidden nodes 2 and 3: their fc1 rows and biases, fc2 columns 2 and 3.
    off = {n: layout.flat.offset(n) for n in MLP}
    expected = sorted(
        [off["fc1.weight"] + r * 6 + c for r in (2, 3) for c in range(6)]
        + [off["fc1.bias"] + 2, off["fc1.bias"] + 3]
        + [off["fc2.weight"] + r * 8 + c for r in range(3) for c in (2, 3)]
    )
    assert node.coords[1].tolist() == expected
    assert common.coords.tolist() == [[off["fc2.bias"] + i for i in range(3)]]


def test_conv_groups_cover_every_floating_coordinate_once() -> None:
    layout = SesaLayout.of(CONV, 2)
    assert layout.descriptors == ("node:c1", "node:c2", "pair:c2/c1", "common")
    shards = [(g.shards, g.length) for g in layout.groups]
    # c1: rows (2 ch x 9) + bias + BN (2 x 3); c2: bias (4) + fc columns (3 x 4 ch x 4 px);
    # pair: 4 x 2 x 9 blocks; common: fc bias.
    assert shards == [(2, 18 + 6), (2, 4 + 48), (4, 72), (1, 3)]
    coords = np.concatenate([g.coords.reshape(-1) for g in layout.groups])
    assert np.array_equal(np.sort(coords), np.arange(layout.flat.size))
    assert "bn1.num_batches_tracked" not in layout.flat.names


def test_hidden_widths_must_split_evenly() -> None:
    with pytest.raises(ConfigurationError, match="multiple of num_shards"):
        SesaLayout.of(MLP, 3)
    with pytest.raises(ConfigurationError, match="num_shards"):
        SesaLayout.of(MLP, 0)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_shard_deltas_and_apply_are_the_count_weighted_average(data: st.DataObject) -> None:
    model = CONV if data.draw(st.booleans()) else MLP
    s = 2 if model is CONV else data.draw(st.sampled_from([1, 2, 4]))
    layout = SesaLayout.of(model, s)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n = data.draw(st.integers(1, 5))
    sums = [np.zeros((g.shards, g.length)) for g in layout.groups]
    weights = [np.zeros(g.shards) for g in layout.groups]
    total = {k: np.zeros(np.shape(v)) for k, v in model.items()}
    count = {k: np.zeros(np.shape(v)) for k, v in model.items()}
    for _ in range(n):
        k = int(rng.integers(1, s + 1))
        choice = {h: sorted(rng.choice(s, k, replace=False).tolist()) for h in layout.widths}
        narrow = layout.width_layout(model, choice)
        trained = {
            name: (v + rng.normal(size=v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
            for name, v in narrow.extract(model).items()
        }
        c = float(rng.uniform(0.5, 2.0))
        deltas = layout.shard_deltas(model, trained, choice)
        for g, (group, ids) in enumerate(zip(layout.groups, layout.slots(choice), strict=True)):
            assert deltas[g].shape == (len(ids), group.length)
            sums[g][list(ids)] += c * deltas[g]
            weights[g][list(ids)] += c
        # Independent reference: the narrow tensors' deltas placed by the width slices.
        start = narrow.extract(model)
        for name in layout.flat.names:
            out_idx, in_idx = narrow.slices.get(name, (None, None))
            shape = np.shape(model[name])
            axes = [np.arange(d) for d in shape]
            if out_idx is not None:
                axes[0] = out_idx
            if in_idx is not None:
                axes[1] = in_idx
            where = np.ix_(*axes)
            total[name][where] += c * (trained[name] - start[name]).astype(np.float64)
            count[name][where] += c
    new = layout.apply(model, sums, weights)
    for name in layout.flat.names:
        held = count[name] > 0
        want = np.asarray(model[name], np.float64).copy()
        want[held] += total[name][held] / count[name][held]
        np.testing.assert_allclose(new[name], want, atol=1e-5)
    for name, value in model.items():
        assert new[name].dtype == value.dtype
        if name not in layout.flat.names:  # integer buffers are not aggregated
            np.testing.assert_array_equal(new[name], value)


def test_client_shard_choices_and_descriptors_are_validated() -> None:
    layers = ("a", "b")
    assert check_selection({"a": [0, 2], "b": [1, 3]}, layers, 4) == {"a": [0, 2], "b": [1, 3]}
    for bad in (
        {"a": [0]},
        {"a": [0], "b": [1], "c": [2]},
        {"a": [], "b": []},
        {"a": [4], "b": [0]},
        {"a": [1, 1], "b": [0, 2]},
        {"a": [2, 1], "b": [0, 2]},
        {"a": [0, 1], "b": [0]},
    ):
        with pytest.raises(ClientInputError):
            check_selection(bad, layers, 4)
    choice = {"a": [0, 2], "b": [1, 3]}
    assert group_slots(["node:a", "pair:b/a", "common"], 4, choice) == (
        (0, 2),
        (4, 6, 12, 14),
        (0,),
    )
    for bad_descriptor in ("node:z", "pair:a", "common:a", "rows:a", "node:a/b", ""):
        with pytest.raises(ClientInputError):
            group_slots([bad_descriptor], 4, choice)
