"""Width-scalable models: keys and shapes across rates, static batch norm, the scaler, slices."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.width.rules import WidthRule, WidthSpec, local_width
from flwr_fsl.models import evaluate, set_torch_threads, train_one
from flwr_fsl.models.width import Scaler, WidthCNN, WidthMLP, calibrate_batch_norm, scaled_width


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    set_torch_threads(1)


def _toy(n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n).astype(np.int64)
    x = rng.random((n, 28, 28), dtype=np.float32) * 0.2
    x[y == 0, :, :14] += 0.7
    x[y == 1, :, 14:] += 0.7
    return x, y


MODELS = [
    (WidthMLP, {}),
    (WidthMLP, {"hidden": (64, 32), "norm": True}),
    (WidthCNN, {}),
    (WidthCNN, {"channels": (8, 12), "norm": False}),
]


@pytest.mark.parametrize(("cls", "kwargs"), MODELS)
@pytest.mark.parametrize("rate", [1.0, 0.5, 0.25, 0.125, 0.0625, 0.3])
def test_keys_equal_the_full_models_with_narrowed_shapes(cls, kwargs, rate) -> None:  # type: ignore[no-untyped-def]
    full = {k: v.numpy() for k, v in cls(**kwargs).state_dict().items()}
    narrow = cls(rate, **kwargs).state_dict()
    assert list(narrow) == list(full)
    spec = WidthSpec.sequential(full)
    indices = WidthRule("static").indices(spec.widths(full), rate, 1, 0)
    expected = spec.layout(full, indices).sub_shapes
    assert {k: tuple(v.shape) for k, v in narrow.items()} == expected
    for layer, width in spec.widths(full).items():
        assert indices[layer].size == scaled_width(width, rate) == local_width(width, rate)


def test_default_sizes() -> None:
    mlp = WidthMLP()
    assert mlp.state_dict()["blocks.0.layer.weight"].shape == (200, 784)
    assert mlp.state_dict()["head.weight"].shape == (10, 200)
    assert WidthMLP(0.25).state_dict()["head.weight"].shape == (10, 50)
    cnn = WidthCNN(0.5)
    assert cnn.widths == (16, 32)
    assert cnn.state_dict()["head.weight"].shape == (10, 32 * 49)
    for shape in [(5, 28, 28), (5, 1, 28, 28), (5, 784)]:
        assert cnn(torch.zeros(shape)).shape == (5, 10)
        assert WidthMLP(0.5)(torch.zeros(shape)).shape == (5, 10)


@pytest.mark.parametrize("cls", [WidthCNN, lambda r: WidthMLP(r, norm=True)])
def test_static_batch_norm_keeps_no_running_statistics(cls) -> None:  # type: ignore[no-untyped-def]
    model = cls(0.5)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)]
    assert norms
    for bn in norms:
        assert bn.momentum is None and not bn.track_running_stats
        assert bn.running_mean is None and bn.running_var is None
    assert not any("running" in k or "num_batches" in k for k in model.state_dict())
    # Without running statistics, evaluation normalizes with the batch's own statistics.
    x = torch.randn(16, 28, 28)
    model.eval()
    with torch.no_grad():
        out = model(x)
        assert torch.isfinite(out).all()
        assert not torch.allclose(model(x[:4]), out[:4])


def test_scaler_divides_hidden_activations_in_training_only() -> None:
    s = Scaler(0.25)
    x = torch.randn(4, 3)
    s.train()
    torch.testing.assert_close(s(x), x * 4)
    s.eval()
    torch.testing.assert_close(s(x), x)
    torch.manual_seed(0)
    mlp = WidthMLP(0.25, hidden=(16,), in_features=6, num_classes=3)
    x = torch.randn(5, 6)
    layer, head = mlp.blocks[0].layer, mlp.head
    mlp.train()
    torch.testing.assert_close(mlp(x), head(torch.relu(layer(x) / 0.25)))
    mlp.eval()
    torch.testing.assert_close(mlp(x), head(torch.relu(layer(x))))
    with pytest.raises(ConfigurationError, match="rate"):
        Scaler(0)


@pytest.mark.parametrize("extraction", ["rolling", "static", "random"])
def test_a_slice_computes_the_full_model_with_the_other_units_removed(extraction: str) -> None:
    # Without batch norm, in evaluation, Net(rate) loaded with a slice equals the full model
    # whose dropped hidden units are cut off (their outgoing weights zeroed).
    torch.manual_seed(1)
    full = WidthMLP(hidden=(40, 24))
    model = OrderedDict((k, v.numpy()) for k, v in full.state_dict().items())
    spec = WidthSpec.sequential(model)
    indices = WidthRule(extraction, seed=2).indices(spec.widths(model), 0.5, 4, 9)  # type: ignore[arg-type]
    layout = spec.layout(model, indices)
    narrow = WidthMLP(0.5, hidden=(40, 24))
    narrow.load_state_dict({k: torch.as_tensor(v) for k, v in layout.extract(model).items()})
    cut = {k: v.copy() for k, v in model.items()}
    for name in ("blocks.0.layer", "blocks.1.layer"):
        dropped = np.setdiff1d(np.arange(model[f"{name}.weight"].shape[0]), indices[name])
        nxt = "blocks.1.layer.weight" if name == "blocks.0.layer" else "head.weight"
        cut[nxt][:, dropped] = 0.0
    reference = WidthMLP(hidden=(40, 24))
    reference.load_state_dict({k: torch.as_tensor(v) for k, v in cut.items()})
    narrow.eval()
    reference.eval()
    x = torch.randn(7, 784)
    torch.testing.assert_close(narrow(x), reference(x), rtol=1e-5, atol=1e-5)


def test_calibrate_batch_norm_collects_the_datas_statistics() -> None:
    torch.manual_seed(3)
    model = WidthCNN(1.0, channels=(4, 6))
    x, _ = _toy(64)
    calibrated = calibrate_batch_norm(model, x, batch_size=16)
    assert not calibrated.training
    bn = calibrated.blocks[0].norm
    with torch.no_grad():
        pre = model.blocks[0].layer(torch.as_tensor(x).reshape(-1, 1, 28, 28))
    # momentum=None: the cumulative average of the four batches' means.
    batch_means = [pre[i : i + 16].mean(dim=(0, 2, 3)) for i in range(0, 64, 16)]
    torch.testing.assert_close(bn.running_mean, torch.stack(batch_means).mean(0))
    # The weights are the model's; evaluation no longer depends on the batch's composition.
    for key, value in model.state_dict().items():
        torch.testing.assert_close(calibrated.state_dict()[key], value)
    xt = torch.as_tensor(x)
    with torch.no_grad():
        torch.testing.assert_close(calibrated(xt[:8]), calibrated(xt)[:8])
    mlp = calibrate_batch_norm(WidthMLP(0.5), x)  # no batch norm: an evaluation copy
    assert not mlp.training
    with pytest.raises(ConfigurationError):
        calibrate_batch_norm(model, x[:0])


@pytest.mark.parametrize("cls", [WidthMLP, WidthCNN])
def test_narrow_models_train(cls) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = cls(0.25)
    x, y = _toy()
    loss0, _ = evaluate(model, x, y)
    train_one(model, x, y, epochs=2, lr=0.05, batch_size=16, seed=0)
    loss1, acc1 = evaluate(model, x, y)
    assert loss1 < loss0 and acc1 > 0.9


def test_constructor_validation() -> None:
    for bad in [0, -0.5, 1.5, float("nan"), True, "0.5"]:
        with pytest.raises(ConfigurationError, match="rate"):
            WidthMLP(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="rate"):
            WidthCNN(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="hidden"):
        WidthMLP(hidden=())
    with pytest.raises(ConfigurationError, match="channels"):
        WidthCNN(channels=(8, 8, 8))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="width"):
        scaled_width(0, 0.5)
