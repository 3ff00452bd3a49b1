"""PrivHFL's heterogeneous models: shapes, secure-evaluable layers only, training loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.models import set_torch_threads
from flwr_fsl.models.privhfl import (
    ARCHITECTURES,
    Residual,
    as_images,
    build_model,
    check_secure_evaluable,
    mlp,
    penultimate_features,
    predict_logits,
    resnet8,
    resnet10,
    retrain,
    secure_layers,
    train_private,
    vgg7,
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    set_torch_threads(1)


def _toy(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n).astype(np.int64)
    x = rng.random((n, 28, 28), dtype=np.float32) * 0.2
    for c in range(3):
        x[y == c, 9 * c : 9 * c + 9, :] += 0.8
    return x, y


@pytest.mark.parametrize(
    ("name", "params"),
    [("vgg7", 20_930), ("resnet8", 19_642), ("resnet10", 38_138), ("mlp", 109_386)],
)
def test_default_sizes_and_shapes(name: str, params: int) -> None:
    model = build_model(name, seed=0)
    assert sum(p.numel() for p in model.parameters()) == params  # the module docstring's table
    out = model(torch.zeros(5, 1, 28, 28))
    assert out.shape == (5, 10)
    check_secure_evaluable(model)


def test_layer_counts_match_the_names() -> None:
    def functional(model: nn.Module) -> int:
        # Main-path conv/linear layers (1x1 shortcut projections are not counted, as in ResNet).
        count = 0
        for m in model:
            if isinstance(m, Residual):
                count += sum(isinstance(x, nn.Conv2d | nn.Linear) for x in m.body)
            elif isinstance(m, nn.Conv2d | nn.Linear):
                count += 1
        return count

    assert functional(vgg7()) == 7
    assert functional(resnet8()) == 8
    assert functional(resnet10()) == 10
    assert sum(isinstance(m, nn.Conv2d) for m in vgg7()) == 6


def test_seeded_builds_are_equal_and_do_not_touch_the_global_generator() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_model("resnet8", seed=7), build_model("resnet8", seed=7)
    assert torch.rand(1) == before
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    c = build_model("resnet8", seed=8)
    assert not torch.equal(a[0].weight, c[0].weight)


def test_residual_blocks_start_as_their_shortcut() -> None:
    model = resnet10()
    x = torch.randn(2, 8, 28, 28)
    block = model[2]
    assert isinstance(block, Residual)
    assert torch.equal(block.body[-1].weight, torch.zeros_like(block.body[-1].weight))
    assert torch.allclose(block(x), x)
    assert all(
        float(m.bias.detach().abs().sum()) == 0 for m in model.modules() if isinstance(m, nn.Conv2d)
    )


def test_residual_is_body_plus_shortcut() -> None:
    body = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.ReLU())
    block = Residual(body)
    x = torch.randn(3, 2, 5, 5)
    assert torch.allclose(block(x), body(x) + x)
    proj = nn.Conv2d(2, 4, 1, stride=2)
    block = Residual(nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1)), proj)
    assert torch.allclose(block(x), block.body(x) + proj(x))
    with pytest.raises(ConfigurationError, match="non-empty"):
        Residual(nn.Sequential())


@pytest.mark.parametrize(
    "bad",
    [
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)),
        nn.Sequential(nn.Flatten(), nn.Dropout(), nn.Linear(784, 2)),
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.AdaptiveAvgPool2d(1)),
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.Sigmoid()),
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2, padding=1)),
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.AvgPool2d(2, ceil_mode=True)),
        nn.Sequential(nn.Conv2d(2, 2, 3, groups=2)),
        nn.Sequential(nn.Conv2d(1, 2, 3, dilation=2)),
        nn.Sequential(Residual(nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Tanh()))),
        nn.Conv2d(1, 2, 3),
    ],
)
def test_check_secure_evaluable_refuses_other_layers(bad: nn.Module) -> None:
    with pytest.raises(ConfigurationError):
        check_secure_evaluable(bad)


def test_secure_layers_walks_residual_paths() -> None:
    kinds = [type(m).__name__ for m in secure_layers(resnet8())]
    # stem, then the first block's body (identity shortcut), ...
    assert kinds[:6] == ["Conv2d", "ReLU", "Conv2d", "ReLU", "Conv2d", "Identity"]
    assert kinds.count("Conv2d") == 1 + 3 * 2 + 2  # stem, bodies, two projections
    assert kinds[-3:] == ["AvgPool2d", "Flatten", "Linear"]


@pytest.mark.parametrize(
    ("builder", "kwargs"),
    [
        (vgg7, {"width": 0}),
        (resnet8, {"width": True}),
        (resnet10, {"num_classes": 1}),
        (mlp, {"hidden": ()}),
        (mlp, {"hidden": (0,)}),
    ],
)
def test_builders_validate(builder, kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError):
        builder(**kwargs)


def test_build_model_unknown_name() -> None:
    with pytest.raises(ConfigurationError, match="unknown architecture"):
        build_model("vgg16")
    assert set(ARCHITECTURES) == {"vgg7", "resnet8", "resnet10", "mlp"}


def test_as_images() -> None:
    x = np.arange(2 * 784, dtype=np.float64).reshape(2, 784)
    t = as_images(x)
    assert t.shape == (2, 1, 28, 28) and t.dtype == torch.float32
    ro = np.zeros((3, 28, 28), dtype=np.float32)
    ro.flags.writeable = False
    assert as_images(ro).shape == (3, 1, 28, 28)
    with pytest.raises(ConfigurationError):
        as_images(np.zeros((2, 783)))
    with pytest.raises(ConfigurationError):
        as_images(np.float32(1.0))


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_architecture_learns_a_toy_task(name: str) -> None:
    x, y = _toy()
    model = build_model(name, num_classes=3, seed=0)
    train_private(model, x, y, epochs=6, lr=0.02, batch_size=32, seed=0)
    acc = float((predict_logits(model, x).argmax(1) == y).mean())
    assert acc > 0.9


def test_train_private_is_seeded_and_validates() -> None:
    x, y = _toy(64)
    a, b = build_model("mlp", 3, seed=1), build_model("mlp", 3, seed=1)
    train_private(a, x, y, epochs=2, seed=5)
    train_private(b, x, y, epochs=2, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = build_model("mlp", 3, seed=1)
    train_private(c, x, y, epochs=2, seed=5, optimizer="adam", lr=1e-3)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))
    for kwargs in (
        {"epochs": -1},
        {"lr": 0.0},
        {"batch_size": 0},
        {"momentum": 1.0},
        {"optimizer": "rmsprop"},
    ):
        with pytest.raises(ConfigurationError):
            train_private(a, x, y, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        train_private(a, x, y[:-1])


def test_retrain_learns_soft_labels_on_queries() -> None:
    # The private data holds only classes 0 and 1; the queries carry class 2 in their soft
    # labels: after re-training the model predicts class 2 on class-2 images it never had.
    x, y = _toy(300)
    private = y < 2
    model = build_model("mlp", 3, seed=0)
    train_private(model, x[private], y[private], epochs=3)
    assert (predict_logits(model, x[~private]).argmax(1) == 2).mean() < 0.1
    soft = np.full((int((~private).sum()), 3), 0.05, dtype=np.float32)
    soft[:, 2] = 0.9
    retrain(model, x[private], y[private], x[~private], soft, epochs=4, lr=2e-3, seed=0)
    assert (predict_logits(model, x[~private]).argmax(1) == 2).mean() > 0.9
    assert (predict_logits(model, x[private]).argmax(1) == y[private]).mean() > 0.9


def test_retrain_validates_soft_labels() -> None:
    x, y = _toy(20)
    model = build_model("mlp", 3, seed=0)
    good = np.full((4, 3), 1 / 3, dtype=np.float32)
    retrain(model, x, y, x[:4], good, epochs=1)
    retrain(model, x, y, None, None, epochs=1)  # private data only
    bad = {
        "shape": good[:, :2] * 1.5,
        "sum": good * 2,
        "negative": np.array([[1.5, -0.5, 0.0]] * 4, dtype=np.float32),
        "nan": np.full((4, 3), np.nan, dtype=np.float32),
    }
    for soft in bad.values():
        with pytest.raises(ConfigurationError):
            retrain(model, x, y, x[:4], soft, epochs=1)
    with pytest.raises(ConfigurationError, match="both"):
        retrain(model, x, y, x[:4], None)
    with pytest.raises(ConfigurationError, match="labels"):
        retrain(model, x, y + 5, None, None)


def test_features_and_logits_shapes() -> None:
    x, _ = _toy(10)
    for name, width in (("vgg7", 32 * 9), ("resnet8", 32), ("resnet10", 32), ("mlp", 64)):
        model = build_model(name, seed=0)
        assert penultimate_features(model, x).shape == (10, width)
        logits = predict_logits(model, x, batch_size=3)
        assert logits.shape == (10, 10) and logits.dtype == np.float32
        assert np.allclose(logits, model(as_images(x)).detach().numpy(), atol=1e-5)
    with pytest.raises(ConfigurationError):
        penultimate_features(nn.Sequential(nn.Flatten(), nn.Linear(784, 2), nn.ReLU()), x)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
@pytest.mark.parametrize("relu", ["drelu", "dcf"])
def test_the_secure_core_evaluates_each_architecture(name: str, relu: str) -> None:
    # The models are what flwr_fsl.families.privhfl.protocol takes: from_torch converts them
    # (residual blocks through Residual.privhfl_residual) and secure prediction equals plaintext.
    from flwr_fsl.families.privhfl.config import SessionSeeds
    from flwr_fsl.families.privhfl.inference import error_bound, from_torch, plaintext_forward
    from flwr_fsl.families.privhfl.protocol import PrivHFLConfig, secure_predict

    model = build_model(name, seed=0).eval()
    secure_model = from_torch(model, (1, 28, 28))
    x = np.random.default_rng(1).random((2, 1, 28, 28)).astype(np.float32)
    plain = plaintext_forward(secure_model, x)
    np.testing.assert_allclose(plain, model(torch.from_numpy(x)).detach().numpy(), atol=1e-4)
    # Fixed session seeds: the secure result is then reproducible. With fresh seeds the
    # paper's DReLU path fails now and then by its documented truncation wrap (a gap of ~1e6).
    seeds = [SessionSeeds(b"a" * 16, b"s" * 16, b"q" * 16)]
    result = secure_predict(
        [secure_model],
        x,
        PrivHFLConfig(comparison=relu),  # type: ignore[arg-type]
        seeds=seeds,
    )
    gap = float(np.abs(result.logits - plain).max())
    assert gap <= min(1e-3, error_bound(secure_model, 1.0))
