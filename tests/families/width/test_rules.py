"""Width extraction: FedRolex / HeteroFL / random / SESA-shard index rules, layer structure,
capacity mixes, the assignment codec, and count-weighted aggregation of width slices.

The reference rules here are written from the official code's text (FedRolex
``resnet_server.py``: ``torch.roll(torch.arange(K), self.rounds % K, -1)[:ceil(K * rate /
global_rate)]``, HeteroFL's prefix, ``randperm(K)[:k]``; SESA §IV's shards) with torch and
plain loops, never by calling the functions under test.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, OrderedDict

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.families.width.rules import (
    RATE_LEVELS,
    CapacityMix,
    WidthAssignment,
    WidthLayer,
    WidthRule,
    WidthSpec,
    assignment_of,
    local_width,
    parse_rate,
    random_indices,
    rolling_indices,
    select_shards,
    shard_channels,
    shards_for_rate,
    static_indices,
)
from flwr_fsl.models.width import WidthCNN, WidthMLP
from flwr_fsl.submodel.aggregate import accumulate_elements, apply_count_weighted

RATES = [1.0, 0.5, 0.25, 0.125, 0.0625, 0.3, 0.7]


def official_k(width: int, rate: float, global_rate: float = 1.0) -> int:
    # resnet_server.py: scaler_rate = model_rate / global_model_rate;
    # local_output_size = int(np.ceil(output_size * scaler_rate))
    scaler_rate = rate / global_rate
    return int(np.ceil(width * scaler_rate))


def official_roll(width: int, rate: float, rounds: int, global_rate: float = 1.0) -> np.ndarray:
    # roll = self.rounds % output_size; model_idx = torch.roll(arange, roll, -1)[:k]
    model_idx = torch.roll(torch.arange(width), rounds % width, -1)
    return model_idx[: official_k(width, rate, global_rate)].numpy()


def _model(seed: int = 0) -> OrderedDict[str, np.ndarray]:
    """A 3-layer MLP-like state dict with a batch norm on the first hidden layer."""
    rng = np.random.default_rng(seed)
    shapes = [
        ("l1.weight", (8, 5)),
        ("l1.bias", (8,)),
        ("bn1.weight", (8,)),
        ("bn1.bias", (8,)),
        ("l2.weight", (6, 8)),
        ("l2.bias", (6,)),
        ("out.weight", (3, 6)),
        ("out.bias", (3,)),
    ]
    return OrderedDict((n, rng.normal(size=s).astype(np.float32)) for n, s in shapes)


# -- the rules -------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 4, 10, 64, 200])
@pytest.mark.parametrize("rate", RATES)
def test_rolling_equals_the_official_rule_round_by_round(width: int, rate: float) -> None:
    for server_round in range(1, 2 * width + 4):
        k = local_width(width, rate)
        got = rolling_indices(width, k, server_round - 1)
        np.testing.assert_array_equal(got, official_roll(width, rate, server_round - 1))


def test_rolling_small_example_wraps() -> None:
    # K = 4, k = 2: rounds 1..5 give [0 1], [3 0], [2 3], [1 2], [0 1].
    got = [rolling_indices(4, 2, r).tolist() for r in range(5)]
    assert got == [[0, 1], [3, 0], [2, 3], [1, 2], [0, 1]]


@pytest.mark.parametrize("global_rate", [1.0, 0.5])
def test_rule_indices_per_layer_share_the_round_shift(global_rate: float) -> None:
    widths = {"conv1": 16, "conv2": 32, "fc": 200}
    rule = WidthRule("rolling", global_rate=global_rate)
    for server_round in (1, 2, 17, 33, 400):
        for rate in (global_rate, global_rate / 2, global_rate / 16):
            for client in (3, 99):  # every client of a round gets the same windows
                got = rule.indices(widths, rate, server_round, client)
                for name, width in widths.items():
                    expected = official_roll(width, rate, server_round - 1, global_rate)
                    np.testing.assert_array_equal(got[name], expected)


@pytest.mark.parametrize("width", [3, 64, 200])
@pytest.mark.parametrize("rate", RATES)
def test_static_is_the_heterofl_prefix(width: int, rate: float) -> None:
    rule = WidthRule("static")
    for server_round in (1, 5):
        got = rule.indices({"h": width}, rate, server_round, client=7)["h"]
        np.testing.assert_array_equal(got, np.arange(int(np.ceil(width * rate))))
    np.testing.assert_array_equal(static_indices(width, 2 if width > 1 else 1)[:1], [0])


def test_random_is_seeded_per_client_round_and_layer() -> None:
    widths = {"a": 50, "b": 50}
    rule = WidthRule("random", seed=11)
    first = rule.indices(widths, 0.25, 3, 1000)
    again = WidthRule("random", seed=11).indices(widths, 0.25, 3, 1000)
    for name in widths:
        np.testing.assert_array_equal(first[name], again[name])
        assert first[name].size == official_k(50, 0.25) == 13
        assert np.unique(first[name]).size == 13
        assert 0 <= first[name].min() and first[name].max() < 50
    others = [
        rule.indices(widths, 0.25, 4, 1000)["a"],  # another round
        rule.indices(widths, 0.25, 3, 1001)["a"],  # another client
        first["b"],  # another layer
        WidthRule("random", seed=12).indices(widths, 0.25, 3, 1000)["a"],  # another seed
    ]
    assert all(not np.array_equal(first["a"], o) for o in others)


def test_random_is_uniform_over_channels() -> None:
    # Like randperm(K)[:k]: every channel kept with probability k / K.
    rule = WidthRule("random", seed=5)
    counts = np.zeros(20)
    draws = 3000
    for client in range(draws):
        counts[rule.indices({"h": 20}, 0.25, 1, client)["h"]] += 1
    expected = draws * 5 / 20
    assert np.all(np.abs(counts - expected) < 0.12 * expected), counts


@pytest.mark.parametrize("extraction", ["rolling", "static", "random"])
def test_indices_sizes_match_the_official_local_width(extraction: str) -> None:
    widths = {"a": 7, "b": 64, "c": 200}
    rule = WidthRule(extraction)  # type: ignore[arg-type]
    for rate in RATES:
        got = rule.indices(widths, rate, 9, 4)
        assert {n: v.size for n, v in got.items()} == {
            n: official_k(w, rate) for n, w in widths.items()
        }


# -- hypothesis properties of the rolling rule ----------------------------------------------


@given(width=st.integers(1, 300), rate=st.floats(1e-3, 1.0), rounds=st.integers(0, 10**6))
def test_rolling_window_properties(width: int, rate: float, rounds: int) -> None:
    k = local_width(width, rate)
    assert 1 <= k <= width
    idx = rolling_indices(width, k, rounds)
    assert idx.size == k and np.unique(idx).size == k
    assert idx.min() >= 0 and idx.max() < width
    # One contiguous window modulo K, starting where the shift puts channel 0's slot.
    assert np.all((np.diff(idx) % width) == 1 % width) if k > 1 else True
    assert idx[0] == (-rounds) % width
    # The next round's window is this one moved by one channel (back), wrapping.
    nxt = rolling_indices(width, k, rounds + 1)
    np.testing.assert_array_equal(nxt, (idx - 1) % width)


@given(width=st.integers(1, 120), rate=st.floats(1e-3, 1.0), start=st.integers(0, 10**5))
def test_rolling_covers_every_channel_k_times_in_k_rounds(
    width: int, rate: float, start: int
) -> None:
    k = local_width(width, rate)
    seen = Counter()
    for r in range(start, start + width):
        seen.update(rolling_indices(width, k, r).tolist())
    assert set(seen) == set(range(width))
    assert set(seen.values()) == {k}


@given(
    width=st.integers(1, 500),
    rates=st.lists(st.floats(1e-3, 1.0), min_size=2, max_size=2),
    global_rate=st.sampled_from([1.0, 0.5, 0.25]),
)
def test_local_width_is_the_official_formula_and_monotone(
    width: int, rates: list[float], global_rate: float
) -> None:
    lo, hi = sorted(r * global_rate for r in rates)
    assert local_width(width, lo, global_rate) == min(width, official_k(width, lo, global_rate))
    assert local_width(width, lo, global_rate) <= local_width(width, hi, global_rate)
    assert local_width(width, global_rate, global_rate) == width


# -- SESA shards --------------------------------------------------------------------------


def test_shards_split_the_layer_into_equal_consecutive_blocks() -> None:
    np.testing.assert_array_equal(shard_channels(12, 4, [2, 0]), [6, 7, 8, 0, 1, 2])
    with pytest.raises(ConfigurationError, match="equal shards"):
        shard_channels(10, 4, [0])
    with pytest.raises(ConfigurationError, match="distinct"):
        shard_channels(12, 4, [1, 1])
    with pytest.raises(ConfigurationError, match="within"):
        shard_channels(12, 4, [4])


@pytest.mark.parametrize(("rate", "count"), [(1.0, 4), (0.5, 2), (0.25, 1)])
def test_select_shards_picks_rate_over_bmin_shards(rate: float, count: int) -> None:
    assert shards_for_rate(rate, 4) == count
    for seed in range(20):
        sel = select_shards(200, 4, rate, np.random.default_rng(seed))
        assert sel.shards.size == count and np.unique(sel.shards).size == count
        assert list(sel.shards) == sorted(sel.shards)
        assert sel.shard_size == 50 and sel.num_shards == 4
        expected = [50 * s + j for s in sel.shards for j in range(50)]
        np.testing.assert_array_equal(sel.channels, expected)
    # OS randomness (a SESA client's secret choice) follows the same shape rules.
    sel = select_shards(200, 4, rate)
    assert sel.shards.size == count and sel.channels.size == 50 * count


def test_select_shards_is_uniform_over_subsets() -> None:
    # C(4, 2) = 6 subsets, each with probability 1/6.
    counts = Counter(
        tuple(select_shards(8, 4, 0.5, np.random.default_rng(s)).shards) for s in range(3000)
    )
    assert set(counts) == set(itertools.combinations(range(4), 2))
    assert all(abs(c - 500) < 75 for c in counts.values()), counts


def test_shards_need_whole_shard_counts() -> None:
    with pytest.raises(ConfigurationError, match="multiple of 1/num_shards"):
        shards_for_rate(0.3, 4)
    with pytest.raises(ConfigurationError, match="multiple of 1/num_shards"):
        WidthRule("shards", num_shards=4).indices({"h": 200}, 0.3, 1, 1)
    with pytest.raises(ConfigurationError, match="num_shards"):
        WidthRule("shards")
    with pytest.raises(ConfigurationError, match="num_shards"):
        WidthRule("rolling", num_shards=4)


def test_shard_rule_is_seeded_and_per_layer() -> None:
    rule = WidthRule("shards", num_shards=4, seed=3)
    got = rule.indices({"h1": 200, "h2": 40}, 0.5, 2, 17)
    assert got["h1"].size == 100 and got["h2"].size == 20
    np.testing.assert_array_equal(got["h1"], rule.indices({"h1": 200, "h2": 40}, 0.5, 2, 17)["h1"])
    for name, width in (("h1", 200), ("h2", 40)):
        blocks = set((got[name] // (width // 4)).tolist())
        assert len(blocks) == 2


# -- capacity mixes ------------------------------------------------------------------------


def test_capacity_mix_parse_and_levels() -> None:
    mix = CapacityMix.parse("a6-b10-c11-d18-e55")
    assert mix.rates == (1.0, 0.5, 0.25, 0.125, 0.0625)
    assert mix.weights == (6, 10, 11, 18, 55)
    assert RATE_LEVELS == {"a": 1, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}
    for bad in ["", "a", "x3", "a0", "a-1", "a1-a2", "a1.5", 7]:
        with pytest.raises(ConfigurationError):
            CapacityMix.parse(bad)  # type: ignore[arg-type]


def test_capacity_mix_fixed_is_heterofls_block_rule() -> None:
    # utils.process_control, 'fix': num_users // sum(p) * p_i users per rate, rest = last rate.
    def reference(mix: str, n: int) -> list[float]:
        parts = mix.split("-")
        rates = [RATE_LEVELS[p[0]] for p in parts]
        props = [int(p[1:]) for p in parts]
        per = n // sum(props)
        out: list[float] = []
        for rate, prop in zip(rates, props, strict=True):
            out += [rate] * (per * prop)
        return out + [out[-1] if out else rates[-1]] * (n - len(out))

    for mix, n in [("a1-b1-c1", 100), ("a1-b1-c1", 3), ("a6-b10-c11-d18-e55", 100),
                   ("a2-e1", 10), ("a1-b1-c1", 7)]:  # fmt: skip
        assert CapacityMix.parse(mix).fixed(n) == reference(mix, n), (mix, n)
    assert Counter(CapacityMix.parse("a1-b1-c1").fixed(100)) == {1.0: 33, 0.5: 33, 0.25: 34}


def test_capacity_mix_draw_is_seeded_with_the_mix_proportions() -> None:
    mix = CapacityMix.parse("a6-b10-c11-d18-e55")
    assert mix.draw(1, 2, 3) == mix.draw(1, 2, 3)
    draws = Counter(mix.draw(0, r, c) for r in range(1, 41) for c in range(100))
    for rate, weight in zip(mix.rates, mix.weights, strict=True):
        assert abs(draws[rate] / 4000 - weight / 100) < 0.025, draws


def test_parse_rate_accepts_numbers_and_letters() -> None:
    assert parse_rate("c") == 0.25 and parse_rate("0.5") == 0.5 and parse_rate(1) == 1.0
    for bad in ["z", "0", "-0.5", "1.5", "nan", True, None, float("inf")]:
        with pytest.raises(ConfigurationError):
            parse_rate(bad)


# -- layer structure -------------------------------------------------------------------------


def test_sequential_spec_of_the_width_models() -> None:
    mlp = {k: v.numpy() for k, v in WidthMLP(hidden=(200, 100), norm=True).state_dict().items()}
    spec = WidthSpec.sequential(mlp)
    assert [layer.name for layer in spec.layers] == ["blocks.0.layer", "blocks.1.layer", "head"]
    assert spec.layers[0].extras == ("blocks.0.norm.weight", "blocks.0.norm.bias")
    assert [layer.scaled for layer in spec.layers] == [True, True, False]
    assert spec.widths(mlp) == {"blocks.0.layer": 200, "blocks.1.layer": 100}
    cnn = {k: v.numpy() for k, v in WidthCNN().state_dict().items()}
    spec = WidthSpec.sequential(cnn)
    assert [layer.in_group for layer in spec.layers] == [1, 1, 49]
    assert spec.widths(cnn) == {"blocks.0.layer": 32, "blocks.1.layer": 64}


def test_spec_rejects_structures_that_do_not_fit() -> None:
    model = _model()
    with pytest.raises(ConfigurationError, match="before any weight"):
        WidthSpec.sequential({"b": np.zeros(3), "w": np.zeros((3, 3))})
    with pytest.raises(ConfigurationError, match="not a sequential model"):
        WidthSpec.sequential({"w": np.zeros((3, 2)), "b": np.zeros(4)})
    with pytest.raises(ConfigurationError, match="not a multiple"):
        WidthSpec.sequential({"w": np.zeros((3, 2)), "v": np.zeros((2, 4))})
    with pytest.raises(ConfigurationError, match="no weight"):
        WidthSpec.sequential({"b": np.zeros(())})
    with pytest.raises(ConfigurationError, match="unique"):
        WidthSpec((WidthLayer("a", "l1.weight"), WidthLayer("a", "l2.weight")))
    with pytest.raises(ConfigurationError, match="more than one layer"):
        WidthSpec((WidthLayer("a", "l1.weight"), WidthLayer("b", "l1.weight")))
    with pytest.raises(ConfigurationError, match="at least one"):
        WidthSpec(())
    spec = WidthSpec((WidthLayer("a", "l1.weight", "l1.bias"), WidthLayer("b", "out.weight")))
    with pytest.raises(ConfigurationError, match="inputs"):
        spec.widths(model)  # out.weight has 6 inputs, l1 8 outputs
    with pytest.raises(ConfigurationError, match="no tensor"):
        WidthSpec((WidthLayer("a", "nope"),)).widths(model)
    with pytest.raises(ConfigurationError, match="expected"):
        WidthSpec((WidthLayer("a", "l1.weight", "l2.bias"),)).widths(model)
    spec = WidthSpec.sequential(model)
    with pytest.raises(ValueError, match="scaled layers"):
        spec.layout(model, {"l1": [0]})
    with pytest.raises(ClientInputError, match="scaled layers"):
        spec.layout(model, {"l1": [0]}, from_client=True)
    with pytest.raises(ClientInputError, match="out of range"):
        spec.layout(model, {"l1": [0, 8], "l2": [1]}, from_client=True)
    with pytest.raises(ClientInputError, match="integer"):
        spec.layout(model, {"l1": [0.5], "l2": [1]}, from_client=True)
    with pytest.raises(ClientInputError, match="duplicate"):
        spec.layout(model, {"l1": [1, 1], "l2": [1]}, from_client=True)


def _official_split(
    model: OrderedDict[str, np.ndarray], rate: float, rounds: int
) -> dict[str, tuple[np.ndarray, ...]]:
    """FedRolex's split_model for a sequential net, restated: weights and 1-D tensors."""
    idx: dict[str, tuple[np.ndarray, ...]] = {}
    idx_i = None
    prev_width = 0
    names = list(model)
    weights = [n for n in names if model[n].ndim > 1]
    for k in names:
        v = torch.as_tensor(model[k])
        if v.dim() > 1:
            if idx_i is None:
                idx_i = torch.arange(v.size(1))
            if k == weights[-1]:  # the classifier keeps every output
                group = v.size(1) // prev_width  # flattened feature map: H * W per channel
                in_idx = (idx_i[:, None] * group + torch.arange(group)).reshape(-1)
                idx[k] = (torch.arange(v.size(0)).numpy(), in_idx.numpy())
                continue
            k_local = int(np.ceil(v.size(0) * rate))
            out_idx = torch.roll(torch.arange(v.size(0)), rounds % v.size(0), -1)[:k_local]
            idx[k] = (out_idx.numpy(), idx_i.numpy())
            idx_i, prev_width = out_idx, v.size(0)
        else:
            idx[k] = (torch.arange(v.size(0)).numpy() if k.startswith(weights[-1][:-7])
                      else idx_i.numpy(),)  # fmt: skip
    return idx


@pytest.mark.parametrize("make", [lambda: WidthMLP(hidden=(40, 24), norm=True), WidthCNN])
@pytest.mark.parametrize("rate", [1.0, 0.5, 0.25])
def test_extracted_slice_equals_the_official_split_and_loads_into_net_rate(make, rate) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    full_net = make()
    model = OrderedDict((k, v.numpy()) for k, v in full_net.state_dict().items())
    spec = WidthSpec.sequential(model)
    widths = spec.widths(model)
    for server_round in (1, 2, 30):
        layout = spec.layout(model, WidthRule("rolling").indices(widths, rate, server_round, 1))
        sub = layout.extract(model)
        official = _official_split(model, rate, server_round - 1)
        for name, value in model.items():
            expected = value[np.ix_(*official[name])] if value.ndim > 1 else value[official[name]]
            np.testing.assert_array_equal(sub[name], expected.reshape(sub[name].shape))
        narrow = type(full_net)(rate, **full_net.config)
        narrow.load_state_dict({k: torch.as_tensor(v) for k, v in sub.items()})  # strict


# -- aggregation -----------------------------------------------------------------------------


def _independent_mean(
    model: dict[str, np.ndarray],
    clients: list[tuple[dict[str, tuple[np.ndarray | None, np.ndarray | None]], dict, float]],
) -> dict[str, np.ndarray]:
    """Per coordinate: weighted mean of the clients holding it; untouched ones unchanged."""
    out = {}
    for name, value in model.items():
        total = np.zeros(value.shape)
        count = np.zeros(value.shape)
        for slices, trained, weight in clients:
            out_idx, in_idx = slices.get(name, (None, None))
            rows = range(value.shape[0]) if out_idx is None else list(out_idx)
            sub = trained[name]
            for i, r in enumerate(rows):
                if value.ndim == 1:
                    total[r] += weight * sub[i]
                    count[r] += weight
                    continue
                cols = range(value.shape[1]) if in_idx is None else list(in_idx)
                for j, c in enumerate(cols):
                    total[r, c] += weight * sub[i, j]
                    count[r, c] += weight
        mean = value.astype(np.float64).copy()
        mask = count > 0
        mean[mask] = total[mask] / count[mask]
        out[name] = mean
    return out


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("extraction", ["rolling", "static", "random", "shards"])
def test_count_weighted_apply_equals_an_independent_per_coordinate_mean(
    extraction: str, weighted: bool
) -> None:
    model = _model(1)
    spec = WidthSpec.sequential(model)
    widths = spec.widths(model)
    rule = WidthRule(extraction, num_shards=2 if extraction == "shards" else None, seed=4)  # type: ignore[arg-type]
    rng = np.random.default_rng(9)
    rates = [1.0, 0.5, 0.5, 0.5] if extraction == "shards" else [1.0, 0.5, 0.25, 0.3]
    layouts, trained, weights = [], [], []
    for client, rate in enumerate(rates):
        layout = spec.layout(model, rule.indices(widths, rate, 3, client))
        layouts.append(layout)
        trained.append(
            {n: rng.normal(size=s).astype(np.float32) for n, s in layout.sub_shapes.items()}
        )
        weights.append(float(rng.integers(1, 50)) if weighted else 1.0)
    parts = [
        lay.elements(lay.delta(model, sub, w))
        for lay, sub, w in zip(layouts, trained, weights, strict=True)
    ]
    sums, counts = accumulate_elements(layouts[0].size, 1, parts)
    new = apply_count_weighted(model, layouts[0], sums, counts)
    clients = [(lay.slices, sub, w) for lay, sub, w in zip(layouts, trained, weights, strict=True)]
    expected = _independent_mean(model, clients)
    for name in model:
        assert new[name].dtype == np.float32
        np.testing.assert_allclose(new[name], expected[name], rtol=1e-5, atol=1e-6)


def test_uncovered_coordinates_keep_their_value() -> None:
    model = _model(2)
    spec = WidthSpec.sequential(model)
    layout = spec.layout(model, {"l1": [0, 1], "l2": [5]})
    sub = {n: np.zeros(s, np.float32) for n, s in layout.sub_shapes.items()}
    part = layout.elements(layout.delta(model, sub))
    sums, counts = accumulate_elements(layout.size, 1, [part])
    new = apply_count_weighted(model, layout, sums, counts)
    assert np.all(new["l1.weight"][2:] == model["l1.weight"][2:])
    assert np.all(new["l1.weight"][:2] == 0)
    assert np.all(new["l2.weight"][5, :2] == 0) and np.all(new["l2.weight"][5, 2:] != 0)
    assert np.all(new["out.weight"][:, 5] == 0) and np.all(new["out.weight"][:, :5] != 0)
    assert np.all(new["out.bias"] == 0)  # every client holds the classifier's bias


# -- the assignment codec --------------------------------------------------------------------


def _assignment() -> WidthAssignment:
    widths = {"blocks.0.layer": 200, "blocks.1.layer": 64}
    return assignment_of(WidthRule("rolling"), widths, 0.25, 7, 1234)


def test_assignment_roundtrip_and_digest() -> None:
    a = _assignment()
    b = WidthAssignment.from_bytes(a.to_bytes())
    assert (b.server_round, b.rate, b.extraction) == (7, 0.25, "rolling")
    assert b.widths == {"blocks.0.layer": 50, "blocks.1.layer": 16}
    for name in a.indices:
        np.testing.assert_array_equal(a.indices[name], b.indices[name])
    assert a.digest == b.digest and len(a.digest) == 32
    b.check_widths({"blocks.0.layer": 200, "blocks.1.layer": 64})
    with pytest.raises(ClientInputError, match="names layers"):
        b.check_widths({"blocks.0.layer": 200})
    with pytest.raises(ClientInputError, match="out of range"):
        b.check_widths({"blocks.0.layer": 200, "blocks.1.layer": 10})


@given(
    server_round=st.integers(1, 2**32 - 1),
    rate=st.floats(1e-6, 1.0),
    extraction=st.sampled_from(["rolling", "static", "random", "shards"]),
    layers=st.dictionaries(
        st.text(min_size=1, max_size=20),
        st.lists(st.integers(0, 2**40), min_size=1, max_size=30, unique=True),
        max_size=4,
    ),
)
def test_assignment_roundtrip_property(server_round, rate, extraction, layers) -> None:  # type: ignore[no-untyped-def]
    a = WidthAssignment(server_round, rate, extraction, {k: np.array(v) for k, v in layers.items()})
    b = WidthAssignment.from_bytes(a.to_bytes())
    assert (b.server_round, b.rate, b.extraction) == (server_round, rate, extraction)
    assert {k: v.tolist() for k, v in b.indices.items()} == layers


def test_assignment_decoder_rejects_malformed_bytes() -> None:
    good = _assignment().to_bytes()
    bad = [
        None,
        "text",
        b"",
        good[:-1],
        good + b"\0",
        b"\4\0\0\0XXXX" + good[8:],  # magic
        good[:8] + b"\x02" + good[9:],  # version
    ]
    for data in bad:
        with pytest.raises(WireFormatError):
            WidthAssignment.from_bytes(data)
    # Field-level violations re-encoded through the raw writer.
    from flwr_fsl.core.wireformat import Writer

    def encode(rnd: int, rate: np.ndarray, code: int, layers: list) -> bytes:  # type: ignore[type-arg]
        w = Writer()
        w.raw(b"FSLW")
        w.u8(1)
        w.u32(rnd)
        w.array(rate)
        w.u8(code)
        w.count(len(layers))
        for name, idx in layers:
            w.raw(name)
            w.array(idx)
        return w.payload()

    ok = [(b"h", np.array([1, 2]))]
    assert WidthAssignment.from_bytes(encode(1, np.array(0.5), 1, ok)).rate == 0.5
    cases = {
        "round 0": encode(0, np.array(0.5), 1, ok),
        "rate 0": encode(1, np.array(0.0), 1, ok),
        "rate nan": encode(1, np.array(np.nan), 1, ok),
        "rate 2": encode(1, np.array(2.0), 1, ok),
        "rate f32": encode(1, np.array(0.5, np.float32), 1, ok),
        "rate vector": encode(1, np.array([0.5]), 1, ok),
        "code 0": encode(1, np.array(0.5), 0, ok),
        "code 5": encode(1, np.array(0.5), 5, ok),
        "negative": encode(1, np.array(0.5), 1, [(b"h", np.array([-1]))]),
        "duplicate idx": encode(1, np.array(0.5), 1, [(b"h", np.array([1, 1]))]),
        "empty idx": encode(1, np.array(0.5), 1, [(b"h", np.zeros(0, np.int64))]),
        "float idx": encode(1, np.array(0.5), 1, [(b"h", np.array([1.0]))]),
        "2-d idx": encode(1, np.array(0.5), 1, [(b"h", np.array([[1]]))]),
        "duplicate layer": encode(1, np.array(0.5), 1, ok + ok),
        "not utf-8": encode(1, np.array(0.5), 1, [(b"\xff", np.array([1]))]),
        "empty name": encode(1, np.array(0.5), 1, [(b"", np.array([1]))]),
    }
    for what, data in cases.items():
        with pytest.raises(WireFormatError):
            WidthAssignment.from_bytes(data)
            pytest.fail(what)


@given(data=st.binary(max_size=200), cut=st.integers(0, 400), flip=st.integers(0, 10**6))
def test_assignment_decoder_fuzz(data: bytes, cut: int, flip: int) -> None:
    good = bytearray(_assignment().to_bytes())
    good[flip % len(good)] ^= 1 + flip % 255
    for sample in (data, bytes(good), bytes(good[:cut]), _assignment().to_bytes()[:cut] + data):
        try:
            decoded = WidthAssignment.from_bytes(sample)
        except WireFormatError:
            continue
        assert WidthAssignment.from_bytes(decoded.to_bytes()).digest == decoded.digest


def test_argument_validation_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="extraction"):
        WidthRule("roll")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="global_rate"):
        WidthRule(global_rate=0)
    with pytest.raises(ConfigurationError, match="seed"):
        WidthRule(seed=-1)
    with pytest.raises(ConfigurationError, match="rate"):
        WidthRule(global_rate=0.5).indices({"h": 10}, 0.75, 1, 1)
    with pytest.raises(ConfigurationError, match="server_round"):
        WidthRule().indices({"h": 10}, 0.5, 0, 1)
    with pytest.raises(ConfigurationError, match="width"):
        local_width(0, 0.5)
    with pytest.raises(ConfigurationError, match="exceeds"):
        rolling_indices(4, 5, 0)
    with pytest.raises(ConfigurationError, match="round_index"):
        rolling_indices(4, 2, -1)
    with pytest.raises(ConfigurationError, match="local width"):
        random_indices(4, 0, np.random.default_rng())
    assert math.isclose(sum(CapacityMix.parse("a1-b3").probabilities), 1.0)


@given(
    extraction=st.sampled_from(["rolling", "static", "random"]),
    rates=st.lists(st.sampled_from([1.0, 0.5, 0.25, 0.2, 0.9]), min_size=1, max_size=6),
    weights=st.lists(st.integers(1, 100), min_size=6, max_size=6),
    server_round=st.integers(1, 50),
    seed=st.integers(0, 2**16),
)
def test_aggregation_property(extraction, rates, weights, server_round, seed) -> None:  # type: ignore[no-untyped-def]
    model = _model(seed)
    spec = WidthSpec.sequential(model)
    rule = WidthRule(extraction, seed=seed)
    rng = np.random.default_rng(seed)
    layouts = [
        spec.layout(model, rule.indices(spec.widths(model), r, server_round, c))
        for c, r in enumerate(rates)
    ]
    trained = [{n: rng.normal(size=s) for n, s in lay.sub_shapes.items()} for lay in layouts]
    ws = [float(w) for w in weights[: len(rates)]]
    parts = [
        lay.elements(lay.delta(model, sub, w))
        for lay, sub, w in zip(layouts, trained, ws, strict=True)
    ]
    sums, counts = accumulate_elements(layouts[0].size, 1, parts)
    new = apply_count_weighted(model, layouts[0], sums, counts)
    expected = _independent_mean(
        model, [(lay.slices, sub, w) for lay, sub, w in zip(layouts, trained, ws, strict=True)]
    )
    for name in model:
        np.testing.assert_allclose(new[name], expected[name], rtol=1e-5, atol=1e-5)
