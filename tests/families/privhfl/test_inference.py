"""Models for secure prediction (flwr_fsl.families.privhfl.inference): from_torch and the
float64 twin equal torch's forward (BatchNorm folded, residual blocks, pooling), layouts equal
torch's unfold, tree max, shape inference and every validation error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    Conv2d,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    SecureModel,
    comparison_bound,
    error_bound,
    from_torch,
    nhwc_patches,
    plaintext_forward,
    pool_windows,
    tree_max,
)


class Block(nn.Module):
    def __init__(self, c: int, project: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1)
        )
        self.short = nn.Conv2d(c, c, 1) if project else None

    def privhfl_residual(self):  # type: ignore[no-untyped-def]
        return self.body, self.short

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + (self.short(x) if self.short is not None else x)


def _randomize_bn(net: nn.Module) -> None:
    for m in net.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.3, 2.0)
            if m.weight is not None:
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.3, 0.3)


NETS = {
    "vgg-like": lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(4, affine=False),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Linear(16, 8),
        nn.BatchNorm1d(8),
        nn.ReLU(),
        nn.Identity(),
        nn.Linear(8, 5),
    ),
    "resnet-like": lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        Block(4, False),
        nn.ReLU(),
        Block(4, True),
        nn.AvgPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
    ),
    "pools": lambda: nn.Sequential(
        nn.MaxPool2d(3, 1), nn.AvgPool2d((2, 2), stride=(2, 2)), nn.Flatten(), nn.Linear(27, 5)
    ),
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_from_torch_and_plaintext_twin_equal_torch(name: str) -> None:
    torch.manual_seed(0)
    net = NETS[name]()
    _randomize_bn(net)
    net.eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        expected = net(x).double().numpy()
    model = from_torch(net, (3, 8, 8))
    assert np.allclose(plaintext_forward(model, x.numpy()), expected, atol=1e-5)
    assert model.architecture.num_outputs == 5


@given(
    st.integers(1, 3), st.integers(3, 8), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1)
)
@settings(max_examples=30)
def test_patches_match_torch_unfold(c: int, h: int, k: int, stride: int, pad: int) -> None:
    if h + 2 * pad < k:
        return
    x = np.random.default_rng(h).normal(size=(2, c, h, h))
    ours = nhwc_patches(x.transpose(0, 2, 3, 1), k, stride, pad)
    theirs = nn.functional.unfold(torch.from_numpy(x), k, padding=pad, stride=stride)
    assert np.allclose(ours, theirs.numpy().transpose(0, 2, 1).reshape(ours.shape))
    # Works on uint64 shares too (padding with ring zeros).
    assert (
        nhwc_patches(x.transpose(0, 2, 3, 1).astype(np.uint64), k, stride, pad).dtype == np.uint64
    )


@given(st.integers(1, 12), st.integers(0, 2**32))
def test_tree_max_is_max_with_m_minus_1_comparisons(m: int, seed: int) -> None:
    w = np.random.default_rng(seed).normal(size=(m, 3, 2))
    calls: list[int] = []

    def relu(v: np.ndarray) -> np.ndarray:
        calls.append(v.shape[0])
        return np.maximum(v, 0)

    assert np.allclose(tree_max(w, relu, np.subtract, np.add), w.max(axis=0), rtol=0, atol=1e-12)
    assert sum(calls) == m - 1 and len(calls) == (m - 1).bit_length()


def test_pool_windows_layout() -> None:
    x = np.arange(2 * 4 * 4 * 3, dtype=float).reshape(2, 4, 4, 3)
    win = pool_windows(x, 2, 2)
    assert win.shape == (4, 2, 2, 2, 3)
    assert np.array_equal(win.max(axis=0), x.reshape(2, 2, 2, 2, 2, 3).max(axis=(2, 4)))


def test_counts_and_bounds() -> None:
    arch = Architecture(
        (1, 4, 4), (Conv2d(1, 2, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(8, 3))
    )
    c = arch.counts()
    # ReLU after the max pool (equal, cheaper): 8 window maxima of 3 comparisons, 8 ReLUs
    assert c == {"relus": 8 * 3 + 8, "macs": 32 * 9 + 24, "params": 18 + 2 + 24 + 3}
    model = SecureModel(
        arch, ((np.ones((2, 1, 3, 3)), np.zeros(2)), (np.ones((3, 8)), np.zeros(3)))
    )
    assert comparison_bound(model, 1.0) == 18.0  # conv: 9 |x|, max-pool difference: twice that
    assert 0 < error_bound(model, 1.0) < 1e-3


def test_architecture_errors() -> None:
    cases = [
        ((4,), (Linear(5, 2),), "expects"),
        ((1, 4, 4), (Conv2d(2, 2, 3),), "expects"),
        ((1, 2, 2), (Conv2d(1, 2, 3), Flatten()), "larger than the input"),
        ((1, 4, 4), (Linear(16, 2),), "expects"),
        ((4,), (MaxPool2d(2),), "needs"),
        ((1, 4, 3), (GlobalAvgPool(),), "square"),
        ((1, 4, 4), (Conv2d(1, 2, 3),), "flat logits"),
        ((2, 4, 4), (Residual((Conv2d(2, 3, 1),)), Flatten()), "shortcut gives"),
        ((0,), (), "input_shape"),
        ((2, 3), (), "input_shape"),
        ((4,), ("relu",), "not a supported layer"),
    ]
    for shape, layers, match in cases:
        with pytest.raises(ConfigurationError, match=match):
            Architecture(shape, layers)  # type: ignore[arg-type]
    for bad in (lambda: Linear(0, 2), lambda: Conv2d(1, 1, 3, padding=-1), lambda: MaxPool2d(2, 0)):
        with pytest.raises(ConfigurationError):
            bad()
    with pytest.raises(ConfigurationError, match="non-empty body"):
        Residual(())


def test_model_errors() -> None:
    arch = Architecture((3,), (Linear(3, 2),))
    w, b = np.zeros((2, 3)), np.zeros(2)
    for params, match in [
        ((), "1 parameter layers"),
        (((w.T, b),), "shape"),
        (((w, None),), "bias must be a real array"),
        (((np.full((2, 3), np.nan), b),), "NaN"),
        (((w, b, b),), "pair"),
        ((("w", b),), "real array"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            SecureModel(arch, params)  # type: ignore[arg-type]
    no_bias = Architecture((3,), (Linear(3, 2, bias=False),))
    with pytest.raises(ConfigurationError, match="no bias"):
        SecureModel(no_bias, ((w, b),))
    with pytest.raises(ConfigurationError, match="Architecture"):
        SecureModel("arch", ())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="queries"):
        plaintext_forward(SecureModel(arch, ((w, b),)), np.zeros((1, 4)))


@pytest.mark.parametrize(
    ("module", "match"),
    [
        (nn.Conv2d(2, 2, 3, groups=2), "groups"),
        (nn.Conv2d(1, 1, 3, dilation=2), "groups or dilation"),
        (nn.Conv2d(1, 1, 3, padding="same"), "numeric zero padding"),
        (nn.Conv2d(1, 1, (3, 1)), "same on both axes"),
        (nn.MaxPool2d(2, padding=1), "padding"),
        (nn.AvgPool2d(2, ceil_mode=True), "ceil_mode"),
        (nn.AvgPool2d(2, divisor_override=3), "divisor_override"),
        (nn.AdaptiveAvgPool2d(2), "AdaptiveAvgPool2d"),
        (nn.Flatten(2), "start_dim"),
        (nn.Sigmoid(), "unsupported module Sigmoid"),
        (nn.Sequential(nn.ReLU(), nn.BatchNorm2d(1)), "must follow"),
    ],
)
def test_from_torch_refuses_unsupported_modules(module: nn.Module, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        from_torch(nn.Sequential(module, nn.Flatten(), nn.LazyLinear(2)), (2, 6, 6))
