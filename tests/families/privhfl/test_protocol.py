"""PrivHFL secure querying (flwr_fsl.families.privhfl.protocol): secure logits equal plaintext
logits within the fixed-point error bound per layer type and end to end (hypothesis over shapes and
inputs, both comparisons), the paper's DReLU leak shown (the querier recovers every hidden
sign), the DCF querier's view independent of the activations, the server's and answerer's
views uniform, aggregation over answerers with dropping, the truncation-wrap rate, the strict
message codec (fuzzed) and error paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPointOverflowError
from flwr_fsl.families.privhfl import protocol as privhfl
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    AvgPool2d,
    Conv2d,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    SecureModel,
    error_bound,
    from_torch,
    plaintext_forward,
)
from flwr_fsl.families.privhfl.protocol import (
    AGG_A,
    AGG_S,
    DRELU_S,
    MATMUL_A,
    MATMUL_DEAL,
    SHARE,
    Message,
    NoAnswerError,
    PrivHFLConfig,
    PrivHFLMessageError,
    QuerierMessageError,
    ServerMessageError,
    SessionSeeds,
    Transcript,
    expect,
    secure_predict,
    softmax,
)

U64 = np.uint64
VARIANTS = ["drelu", "dcf"]


def random_model(arch: Architecture, rng: np.random.Generator, gain: float = 1.0) -> SecureModel:
    params = []
    for w_shape, b_shape in arch.param_shapes():
        fan_in = int(np.prod(w_shape[1:]))
        w = rng.uniform(-1, 1, w_shape) * gain / np.sqrt(fan_in)
        b = rng.uniform(-0.5, 0.5, b_shape) if b_shape is not None else None
        params.append((w, b))
    return SecureModel(arch, tuple(params))


def seeds_from(rng: np.random.Generator, count: int = 1) -> list[SessionSeeds]:
    return [SessionSeeds(rng.bytes(16), rng.bytes(16), rng.bytes(16)) for _ in range(count)]


def check_close(
    model: SecureModel, x: np.ndarray, relu: str, seed: int = 0
) -> privhfl.PredictionResult:
    rng = np.random.default_rng(seed)
    res = secure_predict([model], x, PrivHFLConfig(comparison=relu), seeds=seeds_from(rng))
    plain = plaintext_forward(model, x)
    bound = error_bound(model, float(np.max(np.abs(x))))
    assert res.included == (0,) and not res.dropped
    assert np.max(np.abs(res.logits - plain)) <= bound, (np.max(np.abs(res.logits - plain)), bound)
    return res


# ---------------------------------------------------------------- per layer type


LAYER_CASES = {
    "fc": Architecture((6,), (Linear(6, 4),)),
    "fc-no-bias": Architecture((6,), (Linear(6, 3, bias=False),)),
    "conv": Architecture((2, 6, 6), (Conv2d(2, 3, 3), Flatten())),
    "conv-stride-pad": Architecture((2, 7, 7), (Conv2d(2, 3, 3, stride=2, padding=1), Flatten())),
    "avgpool": Architecture((3, 6, 6), (AvgPool2d(2), Flatten())),
    "avgpool-3x3-s2": Architecture((2, 7, 7), (AvgPool2d(3, 2), Flatten())),
    "global-avgpool": Architecture((3, 5, 5), (GlobalAvgPool(),)),
    "relu": Architecture((10,), (ReLU(),)),
    "maxpool": Architecture((2, 6, 6), (MaxPool2d(2), Flatten())),
    "maxpool-3x3-s2": Architecture((2, 7, 7), (MaxPool2d(3, 2), Flatten())),  # 9 = odd tree
    "residual": Architecture(
        (2, 5, 5),
        (Residual((Conv2d(2, 2, 3, padding=1), ReLU(), Conv2d(2, 2, 3, padding=1))), Flatten()),
    ),
    "residual-conv-shortcut": Architecture(
        (2, 6, 6),
        (
            Residual((Conv2d(2, 3, 3, 2, 1), ReLU()), (Conv2d(2, 3, 1, 2),)),
            ReLU(),
            GlobalAvgPool(),
        ),
    ),
}


@pytest.mark.parametrize("relu", VARIANTS)
@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_each_layer_type_matches_plaintext(case: str, relu: str) -> None:
    arch = LAYER_CASES[case]
    rng = np.random.default_rng(len(case))
    model = random_model(arch, rng)
    x = rng.uniform(-2, 2, (3, *arch.input_shape))
    check_close(model, x, relu, seed=len(case))


@pytest.mark.parametrize("relu", VARIANTS)
def test_relu_and_maxpool_exact_on_the_grid(relu: str) -> None:
    """On values already on the fixed-point grid, comparisons are exact (zero and ties too)."""
    vals = np.array([-3.0, -1.0, -(2.0**-20), 0.0, 2.0**-20, 0.5, 1.0, 7.25, -7.25, 2.0**19])
    model = SecureModel(Architecture((10,), (ReLU(),)), ())
    res = secure_predict([model], vals[None, :], PrivHFLConfig(comparison=relu))
    assert np.array_equal(res.logits[0], np.maximum(vals, 0))
    grid = np.array([[[1, 1, -2, 5], [1, 0, 5, -9], [-4, -4, -3, -3], [-4, -4, -3, -8]]], float)
    pool = SecureModel(Architecture((1, 4, 4), (MaxPool2d(2), Flatten())), ())
    res = secure_predict([pool], grid[None], PrivHFLConfig(comparison=relu))
    assert np.array_equal(res.logits[0], [1, 5, -4, -3])


# ---------------------------------------------------------------- hypothesis: shapes/inputs


@st.composite
def mlp_case(draw):  # type: ignore[no-untyped-def]
    widths = draw(st.lists(st.integers(1, 10), min_size=2, max_size=4))
    layers: list = []
    for i in range(len(widths) - 1):
        layers.append(Linear(widths[i], widths[i + 1], draw(st.booleans())))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Architecture((widths[0],), tuple(layers)), draw(st.integers(1, 4))


@st.composite
def cnn_case(draw):  # type: ignore[no-untyped-def]
    c = draw(st.integers(1, 3))
    h = draw(st.integers(3, 9))
    oc = draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    layers: list = [Conv2d(c, oc, k, draw(st.integers(1, 2)), draw(st.integers(0, 1)))]
    layers.append(ReLU())
    pool = draw(st.sampled_from(["none", "max", "avg"]))
    if pool != "none":
        pk = draw(st.integers(2, 3))
        cls = MaxPool2d if pool == "max" else AvgPool2d
        layers.append(cls(pk, draw(st.integers(1, pk))))
    layers.append(Flatten())
    try:
        flat = Architecture((c, h, h), tuple(layers)).num_outputs
    except ConfigurationError:
        assume(False)
    layers.append(Linear(flat, 3))
    return Architecture((c, h, h), tuple(layers)), draw(st.integers(1, 3))


@pytest.mark.parametrize("relu", VARIANTS)
@given(case=mlp_case(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=15, derandomize=True)
def test_random_mlps_match_plaintext(relu: str, case, seed: int) -> None:  # type: ignore[no-untyped-def]
    arch, n = case
    rng = np.random.default_rng(seed)
    check_close(random_model(arch, rng), rng.uniform(-3, 3, (n, *arch.input_shape)), relu, seed)


@pytest.mark.parametrize("relu", VARIANTS)
@given(case=cnn_case(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=15, derandomize=True)
def test_random_cnns_match_plaintext(relu: str, case, seed: int) -> None:  # type: ignore[no-untyped-def]
    arch, n = case
    rng = np.random.default_rng(seed)
    check_close(random_model(arch, rng), rng.uniform(-2, 2, (n, *arch.input_shape)), relu, seed)


@given(
    values=st.lists(
        st.floats(-1000, 1000, allow_nan=False) | st.sampled_from([0.0, 2.0**-20, -(2.0**-20)]),
        min_size=1,
        max_size=40,
    ),
    relu=st.sampled_from(VARIANTS),
)
@settings(max_examples=25, derandomize=True)
def test_relu_on_arbitrary_values(values: list[float], relu: str) -> None:
    x = np.array(values)[None, :]
    model = SecureModel(Architecture((x.shape[1],), (ReLU(),)), ())
    res = secure_predict([model], x, PrivHFLConfig(comparison=relu))
    assert np.max(np.abs(res.logits - np.maximum(x, 0))) <= 2.0**-20


@given(
    values=st.lists(
        st.integers(-(2**39) + 1, 2**39 - 1) | st.sampled_from([0, 1, -1]), min_size=4, max_size=36
    )
)
@settings(max_examples=25, derandomize=True)
def test_dcf_and_drelu_compute_the_same_relu_and_max(values: list[int]) -> None:
    """The default (DCF) and the paper's DReLU compute the same function, bit for bit: on any
    fixed-point input within the bound, ReLU and max pooling (a tree of comparisons) return
    exactly ``max(x, 0)`` and the window maximum with either, so the default changes no
    output (the logits then differ only by the local truncation's rounding, next test)."""
    x = np.array(values, dtype=np.float64) * 2.0**-20  # on the grid: every comparison exact
    relu = SecureModel(Architecture((len(x),), (ReLU(),)), ())
    side = int(np.sqrt(len(x)))
    pool = SecureModel(Architecture((1, side, side), (MaxPool2d(2), Flatten())), ())
    image = x[: side * side].reshape(1, 1, side, side)
    out = {}
    for comparison in VARIANTS:
        cfg = PrivHFLConfig(comparison=comparison)  # type: ignore[arg-type]
        out[comparison] = (
            secure_predict([relu], x[None, :], cfg).logits,
            secure_predict([pool], image, cfg).logits if side >= 2 else None,
        )
    assert np.array_equal(out["dcf"][0], out["drelu"][0])
    assert np.array_equal(out["dcf"][0][0], np.maximum(x, 0))
    if side >= 2:
        assert np.array_equal(out["dcf"][1], out["drelu"][1])
        assert np.array_equal(out["dcf"][1], plaintext_forward(pool, image))


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_dcf_and_drelu_give_the_same_predictions(name: str) -> None:
    """End to end, the two comparisons' logits agree within the fixed-point error bound and
    every prediction (argmax) is the same: accuracy does not change with the default."""
    net, shape = tiny_models()[name]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(11).uniform(0, 1, (32, *shape))
    logits = {
        c: secure_predict([model], x, PrivHFLConfig(comparison=c)).logits  # type: ignore[arg-type]
        for c in VARIANTS
    }
    bound = error_bound(model, 1.0)
    assert np.max(np.abs(logits["dcf"] - logits["drelu"])) <= 2 * bound
    assert np.array_equal(logits["dcf"].argmax(1), logits["drelu"].argmax(1))
    assert np.array_equal(logits["dcf"].argmax(1), plaintext_forward(model, x).argmax(1))


def test_the_default_comparison_is_dcf() -> None:
    """``PrivHFLConfig()`` and ``secure_predict`` without a config use the leak-free DCF:
    the querier receives only ``agg-S``."""
    assert PrivHFLConfig().comparison == "dcf"
    tr = Transcript(keep_views=True)
    secure_predict([first_layer_model()], np.zeros((2, 6)), transcript=tr, record_leak=True)
    assert tr.kinds_received("Q") == ["agg-S"]


# ---------------------------------------------------------------- end to end from torch


class Block(nn.Module):
    """A ResNet basic block for from_torch (body + optional projection shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def privhfl_residual(self):  # type: ignore[no-untyped-def]
        return self.body, self.shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + (self.shortcut(x) if self.shortcut is not None else x)


def tiny_models() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    cnn = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    resnet = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        Block(4, 4, 1),
        nn.ReLU(),
        Block(4, 8, 2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    for m in resnet.modules():  # non-trivial BatchNorm statistics to fold
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return {"mlp": (mlp, (1, 8, 8)), "cnn": (cnn, (1, 8, 8)), "resnet": (resnet, (1, 8, 8))}


@pytest.mark.parametrize("relu", VARIANTS)
@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_torch_models_end_to_end(name: str, relu: str) -> None:
    net, shape = tiny_models()[name]
    net.eval()
    x = torch.rand(6, *shape)
    with torch.no_grad():
        expected = net(x).double().numpy()
    model = from_torch(net, shape)
    res = secure_predict(
        [model],
        x.numpy(),
        PrivHFLConfig(comparison=relu),
        seeds=seeds_from(np.random.default_rng(1)),
    )
    # float32 torch vs float64 twin: 1e-5; fixed point: the bound.
    assert np.max(np.abs(res.logits - expected)) <= error_bound(model, 1.0) + 1e-5
    assert np.array_equal(res.logits.argmax(1), expected.argmax(1))
    assert np.allclose(res.soft_labels, softmax(res.logits)) and np.allclose(
        res.soft_labels.sum(1), 1
    )


@pytest.mark.parametrize("relu", VARIANTS)
def test_heterogeneous_answerers_aggregate_to_the_sum(relu: str) -> None:
    nets = tiny_models()
    models = [from_torch(nets[k][0].eval(), (1, 8, 8)) for k in ("mlp", "cnn", "resnet")]
    x = np.random.default_rng(2).uniform(0, 1, (4, 1, 8, 8))
    res = secure_predict(
        models, x, PrivHFLConfig(comparison=relu), seeds=seeds_from(np.random.default_rng(3), 3)
    )
    plain = sum(plaintext_forward(m, x) for m in models)
    assert res.included == (0, 1, 2)
    assert np.max(np.abs(res.logits - plain)) <= sum(error_bound(m, 1.0) for m in models)
    assert np.allclose(res.soft_labels, softmax(plain), atol=1e-4)


def test_batch_rows_are_independent_queries() -> None:
    net, shape = tiny_models()["cnn"]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(4).uniform(0, 1, (5, *shape))
    batched = secure_predict([model], x).logits
    single = np.concatenate([secure_predict([model], x[i : i + 1]).logits for i in range(5)])
    assert np.max(np.abs(batched - single)) <= 2 * error_bound(model, 1.0)


# ---------------------------------------------------------------- the paper's DReLU leak


def first_layer_model(sign: float = 1.0) -> SecureModel:
    rng = np.random.default_rng(5)
    arch = Architecture((6,), (Linear(6, 12), ReLU(), Linear(12, 3)))
    w1, b1 = rng.uniform(-1, 1, (12, 6)), rng.uniform(-1, 1, 12)
    return SecureModel(
        arch, ((sign * w1, sign * b1), (np.zeros((3, 12)), np.array([1.0, -2.0, 0.5])))
    )


def test_paper_drelu_leaks_every_hidden_sign_and_magnitude_to_the_querier() -> None:
    """The querier learns z = r x for every comparison: exact signs of the answerer's hidden
    pre-activations on its own queries, and |x| within the factor 2^(62 - bound_bits)."""
    net, shape = tiny_models()["cnn"]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(6).uniform(0, 1, (4, *shape))
    cfg = PrivHFLConfig(comparison="drelu")
    res = secure_predict([model], x, cfg, record_leak=True)
    hidden: list[np.ndarray] = []
    plaintext_forward(model, x, record=hidden)
    learned = res.learned[0]
    assert len(learned) == len(hidden) == 6  # ReLU, 2 pool levels, ReLU, 2 pool levels
    u = 2.0**-cfg.frac_bits
    tol = 1e-4  # the secure comparison inputs are within this of the plaintext ones
    for z, h in zip(learned, hidden, strict=True):
        h = h.reshape(-1)
        clear = np.abs(h) > tol  # max-pool differences of ReLU'd zeros are exactly 0
        assert clear.sum() > 20
        assert np.array_equal(z[clear] >= 0, h[clear] >= 0)  # every clear sign recovered
        mag = np.abs(z.astype(np.float64)) * u
        assert np.all(mag >= np.abs(h) - tol)  # |x| <= |z|
        assert np.all(mag <= 2.0**cfg.scale_bits * (np.abs(h) + tol))  # |z| <= 2^s |x|
    # First layer: the signs of W q + b for the querier's own q — a hyperplane oracle.
    direct = SecureModel(
        Architecture((6,), (Linear(6, 12), ReLU(), Linear(12, 3))), first_layer_model().params
    )
    q = np.random.default_rng(7).uniform(-1, 1, (50, 6))
    leak = secure_predict([direct], q, cfg, record_leak=True).learned[0][0].reshape(50, 12)
    w1, b1 = direct.params[0]
    pre = q @ w1.T + b1
    assert np.array_equal(leak >= 0, pre >= 0)


def test_querier_view_dcf_is_independent_of_hidden_signs_paper_is_not() -> None:
    """Two answerers whose hidden activations have opposite signs and whose outputs agree.
    With the same seeds the DCF querier receives byte-identical messages (only agg-S); the
    paper's querier receives z with every sign flipped."""
    x = np.random.default_rng(8).uniform(-1, 1, (8, 6))
    seeds = seeds_from(np.random.default_rng(9))
    views = {}
    for relu in VARIANTS:
        for sign in (1.0, -1.0):
            tr = Transcript(keep_views=True)
            res = secure_predict(
                [first_layer_model(sign)],
                x,
                PrivHFLConfig(comparison=relu),
                seeds=seeds,
                transcript=tr,
            )
            assert np.array_equal(res.logits, np.tile([1.0, -2.0, 0.5], (8, 1)))
            views[relu, sign] = [m.to_bytes() for m in tr.views["Q"]]
            kinds = tr.kinds_received("Q")
            assert kinds == (["agg-S"] if relu == "dcf" else ["drelu-z", "agg-S"])
    assert views["dcf", 1.0] == views["dcf", -1.0]
    assert views["drelu", 1.0] != views["drelu", -1.0]
    z_pos = Message.from_bytes(views["drelu", 1.0][0]).arrays[0]
    z_neg = Message.from_bytes(views["drelu", -1.0][0]).arrays[0]
    delta = privhfl._RING.random(
        z_pos.shape, privhfl._stream(seeds[0].querier_answerer, 3, privhfl.TAG_DRELU_MASK)
    )
    signs_pos = (z_pos + delta).view(np.int64) >= 0
    signs_neg = (z_neg + delta).view(np.int64) >= 0
    nonzero = (
        np.abs(x @ first_layer_model().params[0][0].T + first_layer_model().params[0][1]).reshape(
            -1
        )
        > 1e-4
    )
    assert np.array_equal(signs_pos[nonzero], ~signs_neg[nonzero])


# ---------------------------------------------------------------- views of S and A


def _words(messages: list[Message]) -> np.ndarray:
    return np.concatenate([a.reshape(-1) for m in messages for a in m.arrays if m.kind != AGG_S])


def _assert_fair_and_alike(a: np.ndarray, b: np.ndarray) -> None:
    """64 bit positions of two word samples: each a fair coin, and the two samples agree."""
    bits_a = np.unpackbits(a.view(np.uint8).reshape(-1, 8), axis=1)
    bits_b = np.unpackbits(b.view(np.uint8).reshape(-1, 8), axis=1)
    for bits in (bits_a, bits_b):
        n = bits.shape[0]
        c = bits.sum(axis=0)
        chi2 = (((c - n / 2) ** 2) / (n / 4)).sum()
        assert abs(chi2 - 64) < 6 * np.sqrt(128), chi2
    pa, pb = bits_a.mean(axis=0), bits_b.mean(axis=0)
    p = (pa + pb) / 2
    z2 = (pa - pb) ** 2 / (p * (1 - p) * (1 / bits_a.shape[0] + 1 / bits_b.shape[0]))
    assert abs(z2.sum() - 64) < 6 * np.sqrt(128), z2.sum()
    assert z2.max() < 36


@pytest.mark.parametrize("relu", VARIANTS)
def test_server_and_answerer_views_are_uniform_and_independent_of_the_secrets(relu: str) -> None:
    """Every word S and A receive (shares, masked weights, openings, corrections) is a fair
    coin in each bit, for a model and its sign-flipped twin on different queries."""
    net, shape = tiny_models()["cnn"]
    model = from_torch(net.eval(), shape)
    flipped = SecureModel(
        model.architecture, tuple((-w, -b if b is not None else None) for w, b in model.params)
    )
    views = []
    for i, (m, x) in enumerate(((model, np.zeros((12, *shape))), (flipped, np.ones((12, *shape))))):
        tr = Transcript(keep_views=True)
        secure_predict(
            [m],
            x,
            PrivHFLConfig(comparison=relu),
            seeds=seeds_from(np.random.default_rng(10 + i)),
            transcript=tr,
        )
        views.append(tr)
    for party in ("S", "A0"):
        a, b = _words(views[0].views[party]), _words(views[1].views[party])
        assert a.size > 5000
        _assert_fair_and_alike(a, b)


def test_view_check_detects_the_querier_leak() -> None:
    """The same check fails on the paper's querier view (signs of z)."""
    x = np.random.default_rng(11).uniform(-1, 1, (400, 6))
    views = []
    for sign in (1.0, -1.0):
        tr = Transcript(keep_views=True)
        res = secure_predict(
            [first_layer_model(sign)],
            x,
            PrivHFLConfig(comparison="drelu"),
            transcript=tr,
            record_leak=True,
        )
        views.append(res.learned[0][0].view(U64))
    with pytest.raises(AssertionError):
        _assert_fair_and_alike(views[0], views[1])


# ---------------------------------------------------------------- truncation wrap


def test_truncation_wrap_rate_matches_the_secureml_bound() -> None:
    """A product v at scale 2^40 truncates wrongly with probability |v| / 2^64: here v = 2^60
    (1/16); the wrong outputs are off by about 2^24 and as frequent as predicted."""
    n, outs = 64, 32
    model = SecureModel(
        Architecture((1,), (Linear(1, outs, bias=False),)), ((np.full((outs, 1), 1024.0), None),)
    )
    res = secure_predict(
        [model], np.full((n, 1), 1024.0), seeds=seeds_from(np.random.default_rng(12))
    )
    wrong = np.abs(res.logits - 2.0**20) > 1e-3
    assert np.all(np.abs(np.abs(res.logits[wrong] - 2.0**20) - 2.0**24) < 1)
    expected = n * outs / 16
    assert abs(wrong.sum() - expected) < 5 * np.sqrt(expected * 15 / 16), wrong.sum()


# ---------------------------------------------------------------- dropping and failures


def _tamper(target: tuple[str, str, int], how) -> privhfl.Tamper:  # type: ignore[no-untyped-def]
    def hook(sender: str, receiver: str, kind: int, data: bytes) -> bytes:
        return how(data) if (sender, receiver, kind) == target else data

    return hook


BAD = {
    "truncated": lambda d: d[:-3],
    "trailing": lambda d: d + b"\0",
    "wrong-kind": lambda d: d[:5] + bytes([SHARE if d[5] != SHARE else AGG_A]) + d[6:],
    "wrong-step": lambda d: (
        d[:6] + (int.from_bytes(d[6:14], "little") + 1).to_bytes(8, "little") + d[14:]
    ),
    "garbage": lambda d: b"\xff" * 20,
}


@pytest.mark.parametrize("how", sorted(BAD))
@pytest.mark.parametrize(
    ("target", "relu"),
    [
        (("A1", "S", MATMUL_A), "drelu"),
        (("A1", "S", privhfl.DRELU_A), "drelu"),
        (("A1", "S", privhfl.BEAVER_A), "drelu"),
        (("S", "A1", privhfl.BEAVER_S), "drelu"),
        (("A1", "S", privhfl.DCF_OPEN_A), "dcf"),
        (("S", "A1", privhfl.DCF_KEYS), "dcf"),
        (("A1", "S", AGG_A), "dcf"),
    ],
)
def test_malformed_answerer_session_is_dropped(target, relu: str, how: str) -> None:  # type: ignore[no-untyped-def]
    net, shape = tiny_models()["mlp"]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(13).uniform(0, 1, (3, *shape))
    res = secure_predict(
        [model, model], x, PrivHFLConfig(comparison=relu), tamper=_tamper(target, BAD[how])
    )
    assert res.included == (0,) and set(res.dropped) == {1}
    assert np.max(np.abs(res.logits - plaintext_forward(model, x))) <= error_bound(model, 1.0)


@pytest.mark.parametrize(
    ("kind", "comparison"),
    [
        (SHARE, "dcf"),
        (MATMUL_DEAL, "dcf"),
        (privhfl.DCF_KEYS, "dcf"),
        (SHARE, "drelu"),
        (privhfl.TRIPLE_DEAL, "drelu"),
        (DRELU_S, "drelu"),
    ],
)
def test_malformed_querier_or_server_message_fails_the_query(kind: int, comparison: str) -> None:
    net, shape = tiny_models()["mlp"]
    model = from_torch(net.eval(), shape)
    x = np.zeros((2, *shape))
    sender, receiver = ("S", "Q") if kind == DRELU_S else ("Q", "S")
    expected = ServerMessageError if kind == DRELU_S else QuerierMessageError
    with pytest.raises(expected):
        secure_predict(
            [model, model],
            x,
            PrivHFLConfig(comparison=comparison),  # type: ignore[arg-type]
            tamper=_tamper((sender, receiver, kind), BAD["truncated"]),
        )


def test_every_answerer_dropped_and_bad_aggregate() -> None:
    model = first_layer_model()
    x = np.zeros((2, 6))

    def all_bad(sender: str, receiver: str, kind: int, data: bytes) -> bytes:
        return data[:-1] if kind == MATMUL_A else data

    with pytest.raises(NoAnswerError):
        secure_predict([model, model], x, tamper=all_bad)
    with pytest.raises(ServerMessageError, match="agg-S"):
        secure_predict([model], x, tamper=_tamper(("S", "Q", AGG_S), BAD["wrong-step"]))
    ids_bad = _tamper(
        ("S", "Q", AGG_S),
        lambda d: Message(
            AGG_S,
            Message.from_bytes(d).step,
            (Message.from_bytes(d).arrays[0], np.array([0, 0], U64)),
        ).to_bytes(),
    )
    with pytest.raises(ServerMessageError, match="unknown or repeated"):
        secure_predict([model], x, tamper=ids_bad)


def test_dcf_public_part_of_the_wrong_geometry_drops_the_session() -> None:
    model = first_layer_model()
    x = np.zeros((2, 6))

    def shrink(data: bytes) -> bytes:
        msg = Message.from_bytes(data)
        return Message(msg.kind, msg.step, msg.arrays, msg.blob[:-1]).to_bytes()

    with pytest.raises(QuerierMessageError, match="DCF public part"):
        secure_predict(
            [model],
            x,
            PrivHFLConfig(comparison="dcf"),
            tamper=_tamper(("Q", "S", privhfl.DCF_KEYS), shrink),
        )
    res = secure_predict(
        [model, model],
        x,
        PrivHFLConfig(comparison="dcf"),
        tamper=_tamper(("S", "A1", privhfl.DCF_KEYS), shrink),
    )
    assert res.included == (0,) and "DCF public part" in res.dropped[1]


def test_server_forwards_the_querier_dcf_keys_unchanged() -> None:
    # Issue 26: one dcf-keys message per comparison serves both evaluators (each one's shares
    # of q and r q come from its own seed plus the public correction), so S forwards Q's bytes.
    net, shape = tiny_models()["cnn"]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(3).uniform(0, 1, (2, *shape))
    sent: list[tuple[str, str, int, bytes]] = []

    def record(sender: str, receiver: str, kind: int, data: bytes) -> bytes:
        sent.append((sender, receiver, kind, data))
        return data

    res = secure_predict([model], x, PrivHFLConfig(comparison="dcf"), tamper=record)
    assert np.max(np.abs(res.logits - plaintext_forward(model, x))) <= error_bound(model, 1.0)
    dealt = [d for s, r, k, d in sent if (s, r, k) == ("Q", "S", privhfl.DCF_KEYS)]
    forwarded = [d for s, r, k, d in sent if (s, r, k) == ("S", "A0", privhfl.DCF_KEYS)]
    assert len(dealt) == 6  # two blocks: a max-pool of two rounds, then the ReLU
    assert forwarded == dealt
    assert not {k for _, _, k, _ in sent} & {privhfl.DCF_DEAL, privhfl.DCF_RELAY}


# ---------------------------------------------------------------- codec


def test_message_round_trip_and_expect() -> None:
    arrays = (np.arange(6, dtype=U64).reshape(2, 3), np.zeros(0, U64))
    msg = Message(MATMUL_A, 7, arrays, b"blob")
    back = Message.from_bytes(msg.to_bytes())
    assert (back.kind, back.step, back.blob) == (MATMUL_A, 7, b"blob")
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back.arrays, strict=True))
    data = msg.to_bytes()
    assert expect(data, MATMUL_A, 7, [(2, 3), (0,)], blob=True)
    for kind, step, shapes, blob, match in [
        (MATMUL_DEAL, 7, [(2, 3), (0,)], True, "expected"),
        (MATMUL_A, 8, [(2, 3), (0,)], True, "step"),
        (MATMUL_A, 7, [(3, 2), (0,)], True, "shapes"),
        (MATMUL_A, 7, [(2, 3), (0,)], False, "blob"),
    ]:
        with pytest.raises(PrivHFLMessageError, match=match):
            expect(data, kind, step, shapes, blob=blob)
    with pytest.raises(QuerierMessageError):
        expect(data, MATMUL_DEAL, 7, [], sender="querier")


def test_large_messages_are_the_join_of_their_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    # wire.assemble builds a large message in place in prefaulted pages: the same bytes.
    from flwr_fsl.families.privhfl import wire

    monkeypatch.setattr(wire, "_PREFAULT_BYTES", 64)
    rng = np.random.default_rng(5)
    arrays = (rng.integers(0, 2**63, (70, 3), dtype=U64), np.zeros(0, U64))
    blob = (b"head", rng.integers(0, 255, 10_001, dtype=np.uint8).data, b"", b"tail")
    msg = Message(MATMUL_A, 9, arrays, blob)
    data = msg.to_bytes()
    assert isinstance(data, bytes)
    monkeypatch.setattr(wire, "_PREFAULT_BYTES", 1 << 62)  # the plain join
    assert data == msg.to_bytes()
    back = Message.from_bytes(data)
    assert bytes(back.blob) == b"".join(bytes(p) for p in blob)
    assert np.array_equal(back.arrays[0], arrays[0])
    if wire._API is not None:
        monkeypatch.setattr(wire, "_PREFAULT_BYTES", 1)
        with pytest.raises(ConfigurationError, match="expected"):
            wire.assemble([b"abc"], 4)


def test_codec_refuses_bad_messages() -> None:
    good = Message(SHARE, 1, (np.ones(3, U64),)).to_bytes()
    for bad, match in [
        (b"XHFL" + good[4:], "not PrivHFL"),
        (good[:4] + b"\x01" + good[5:], "version"),  # version 1: no alignment (issue 26)
        (good[:4] + b"\x03" + good[5:], "version"),
        (good[:5] + b"\x63" + good[6:], "unknown PrivHFL message kind"),
        (good[:14] + b"\x09" + good[15:], "arrays"),
        (good + b"\0", "trailing"),
        (good[:-2], "truncated"),
        ("text", "must be bytes"),
    ]:
        with pytest.raises(PrivHFLMessageError, match=match):
            Message.from_bytes(bad)
    int_array = good[:16] + b"\x02" + good[17:]  # dtype code 2 = int64
    with pytest.raises(PrivHFLMessageError, match="uint64"):
        Message.from_bytes(int_array)
    # Every alignment byte must be zero (one encoding per message): the header's, an array's
    # six after its ndim, the blob length's four.
    with_blob = Message(SHARE, 1, (np.ones(3, U64),), b"abc").to_bytes()
    for at, what in [(15, "header"), (18, "ndim"), (23, "ndim"), (60, "blob length")]:
        bad = with_blob[:at] + b"\x01" + with_blob[at + 1 :]
        with pytest.raises(PrivHFLMessageError, match=f"padding after the .*{what}"):
            Message.from_bytes(bad)


def test_arrays_and_blob_are_8_byte_aligned() -> None:
    # Version 2 (issue 26): views of the words and of a DCF public part are aligned uint64.
    arrays = (np.arange(3, dtype=U64), np.ones((2, 5), U64), np.zeros((1, 1, 1), U64))
    for blob in (b"", b"x" * 13):
        data = Message(privhfl.DCF_KEYS, 5, arrays, blob).to_bytes()
        back = Message.from_bytes(data)
        base = np.frombuffer(data, np.uint8).ctypes.data
        for a in back.arrays:
            assert (a.ctypes.data - base) % 8 == 0
        assert (np.frombuffer(back.blob, np.uint8).ctypes.data - base) % 8 == 0 or not blob
    with pytest.raises(ConfigurationError, match="uint64"):
        Message(SHARE, 1, (np.ones(2, np.int64),)).to_bytes()  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="kind"):
        Message(99, 1).to_bytes()


@given(st.data())
@settings(max_examples=200)
def test_fuzzed_messages_parse_or_raise_client_input_error(data) -> None:  # type: ignore[no-untyped-def]
    base = bytearray(
        Message(DRELU_S, 5, (np.arange(4, dtype=U64), np.ones((2, 2), U64)), b"xy").to_bytes()
    )
    for _ in range(data.draw(st.integers(1, 4))):
        base[data.draw(st.integers(0, len(base) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        base = base[: data.draw(st.integers(0, len(base)))]
    try:
        msg = Message.from_bytes(bytes(base))
    except PrivHFLMessageError as err:
        assert isinstance(err, ClientInputError)
    else:
        assert msg.to_bytes() == bytes(base)


# ---------------------------------------------------------------- configuration


def test_configuration_errors() -> None:
    for kwargs in [
        {"comparison": "gc"},
        {"comparison": "relu"},
        {"frac_bits": 0},
        {"frac_bits": 29},
        {"bound_bits": 20},
        {"bound_bits": 61},
        {"frac_bits": True},
    ]:
        with pytest.raises(ConfigurationError):
            PrivHFLConfig(**kwargs)  # type: ignore[arg-type]
    assert PrivHFLConfig().scale_bits == 22 and PrivHFLConfig().max_input == 2.0**20
    with pytest.raises(ConfigurationError, match="16 bytes"):
        SessionSeeds(b"a" * 15, b"b" * 16, b"c" * 16)
    with pytest.raises(ConfigurationError, match="distinct"):
        SessionSeeds(b"a" * 16, b"a" * 16, b"c" * 16)
    model = first_layer_model()
    with pytest.raises(ConfigurationError, match="at least one"):
        secure_predict([], np.zeros((1, 6)))
    other = SecureModel(Architecture((6,), (Linear(6, 4),)), ((np.zeros((4, 6)), np.zeros(4)),))
    with pytest.raises(ConfigurationError, match="one output size"):
        secure_predict([model, other], np.zeros((1, 6)))
    with pytest.raises(ConfigurationError, match="SessionSeeds"):
        secure_predict([model], np.zeros((1, 6)), seeds=[])
    with pytest.raises(ConfigurationError, match="queries"):
        secure_predict([model], np.zeros((1, 5)))
    with pytest.raises(ConfigurationError, match="at least one query"):
        secure_predict([model], np.zeros((0, 6)))
    with pytest.raises(FixedPointOverflowError):
        secure_predict([model], np.full((1, 6), 2.0**21))
    huge = SecureModel(
        model.architecture, ((np.full((12, 6), 2.0**21), np.zeros(12)), model.params[1])
    )
    with pytest.raises(ConfigurationError, match="fixed-point range"):
        secure_predict([huge], np.zeros((1, 6)))
    with pytest.raises(ConfigurationError, match="session"):
        privhfl.Answerer(PrivHFLConfig(), model, 1, SessionSeeds.fresh(), session=2**32)
    with pytest.raises(ConfigurationError, match="batch"):
        privhfl.ServerParty(PrivHFLConfig(), model.architecture, 0, SessionSeeds.fresh())
    for args, match in [
        (("cfg", model.architecture, 1, SessionSeeds.fresh()), "PrivHFLConfig"),
        ((PrivHFLConfig(), "arch", 1, SessionSeeds.fresh()), "Architecture"),
        ((PrivHFLConfig(), model.architecture, 1, b"seeds"), "SessionSeeds"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            privhfl.QuerierSession(*args)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="SecureModel"):
        privhfl.Answerer(PrivHFLConfig(), "model", 1, SessionSeeds.fresh())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="QuerierSession"):
        privhfl.Querier(PrivHFLConfig(), {})


def test_querier_learns_only_the_sum_of_the_answerers_logits() -> None:
    """Two pairs of answerers with different individual logits but the same sum: with the
    same seeds, the DCF querier's whole view (the agg-S message) is byte-identical."""
    x = np.random.default_rng(14).uniform(-1, 1, (4, 6))
    seeds = seeds_from(np.random.default_rng(15), 2)

    def with_bias(bias: list[float]) -> SecureModel:
        m = first_layer_model()
        return SecureModel(m.architecture, (m.params[0], (np.zeros((3, 12)), np.array(bias))))

    views = []
    for pair in (([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]), ([0.0, 0.0, 0.0], [1.5, 2.5, 3.5])):
        tr = Transcript(keep_views=True)
        res = secure_predict(
            [with_bias(b) for b in pair],
            x,
            PrivHFLConfig(comparison="dcf"),
            seeds=seeds,
            transcript=tr,
        )
        assert np.array_equal(res.logits, np.tile([1.5, 2.5, 3.5], (4, 1)))
        assert tr.kinds_received("Q") == ["agg-S"]
        views.append(tr.views["Q"][0].to_bytes())
    assert views[0] == views[1]


@pytest.mark.parametrize("relu", VARIANTS)
def test_max_batch_keeps_every_message_under_the_limit(relu: str) -> None:
    """A session of max_batch(limit) queries sends no message over limit; the default limit
    (512 MiB) allows 6 queries of VGG-7 at widths 64-128-256 with the DCF."""
    net, shape = tiny_models()["cnn"]
    model = from_torch(net.eval(), shape)
    cfg = PrivHFLConfig(comparison=relu)
    room = (1 << 40) - 4096  # so large that the floor recovers the exact bytes per query
    per_query = room // privhfl.max_batch(model.architecture, cfg, limit=1 << 40)
    limit = 4096 + 3 * per_query
    batch = privhfl.max_batch(model.architecture, cfg, limit=limit)
    assert batch == 3
    tr = Transcript()
    x = np.random.default_rng(5).uniform(-1, 1, (batch, *shape))
    secure_predict([model], x, cfg, transcript=tr)
    assert max(size for *_, size in tr.records) <= limit
    with pytest.raises(ConfigurationError, match="message"):
        privhfl.max_batch(model.architecture, cfg, limit=5000)
    big = privhfl.max_batch(model.architecture, cfg)
    with pytest.raises(ConfigurationError, match="split them into sessions"):
        secure_predict([model], np.zeros((big + 1, *shape)), cfg)


def test_max_batch_of_vgg7_at_width_64() -> None:
    layers: list[nn.Module] = []
    cin = 3
    for w in (64, 128, 256):
        layers += [nn.Conv2d(cin, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1)]
        layers += [nn.ReLU(), nn.MaxPool2d(2)]
        cin = w
    net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(256 * 16, 10)).eval()
    arch = from_torch(net, (3, 32, 32)).architecture
    assert arch.counts()["relus"] == 229_376  # 315,392 with each ReLU before its max pool
    assert privhfl.max_batch(arch) == 6
    assert privhfl.max_batch(arch, PrivHFLConfig(comparison="drelu")) == 511
