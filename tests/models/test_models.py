"""Tests of the shared MNIST CNN and its training/evaluation loops (generated data)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.models import MnistCNN, evaluate, set_torch_threads, train_one


def _toy(n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two classes told apart by which half of the image is bright."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n).astype(np.int64)
    x = rng.random((n, 28, 28), dtype=np.float32) * 0.2
    x[y == 0, :, :14] += 0.7
    x[y == 1, :, 14:] += 0.7
    return x, y


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    set_torch_threads(1)


@pytest.mark.parametrize("shape", [(5, 28, 28), (5, 1, 28, 28), (5, 784)])
def test_forward_shapes(shape: tuple[int, ...]) -> None:
    model = MnistCNN()
    assert model(torch.zeros(shape)).shape == (5, 10)


def test_training_learns_and_improves_accuracy() -> None:
    torch.manual_seed(0)
    model = MnistCNN()
    x, y = _toy()
    loss0, _ = evaluate(model, x, y)
    train_one(model, x, y, epochs=3, lr=0.05, batch_size=16, seed=0)
    loss1, acc1 = evaluate(model, x, y)
    assert loss1 < loss0
    assert acc1 > 0.95


def test_training_is_deterministic_for_a_seed() -> None:
    x, y = _toy(64)
    states = []
    for _ in range(2):
        torch.manual_seed(1)
        model = MnistCNN()
        train_one(model, x, y, epochs=1, lr=0.1, batch_size=8, seed=7)
        states.append(model.state_dict())
    for key in states[0]:
        torch.testing.assert_close(states[0][key], states[1][key])


def test_read_only_inputs_are_accepted() -> None:
    x, y = _toy(32)
    x.setflags(write=False)
    y.setflags(write=False)
    model = MnistCNN()
    train_one(model, x, y, epochs=1, batch_size=8)
    _, acc = evaluate(model, x, y)
    assert 0.0 <= acc <= 1.0


def test_flower_arrayrecord_roundtrip() -> None:
    torch.manual_seed(0)
    a, b = MnistCNN(), MnistCNN()
    record = ArrayRecord(a.state_dict())
    b.load_state_dict(record.to_torch_state_dict())
    x, _ = _toy(4)
    torch.testing.assert_close(a(torch.as_tensor(x)), b(torch.as_tensor(x)))


def test_argument_validation() -> None:
    model = MnistCNN()
    x, y = _toy(8)
    with pytest.raises(ConfigurationError, match="same length"):
        train_one(model, x, y[:4])
    with pytest.raises(ConfigurationError, match="epochs"):
        train_one(model, x, y, epochs=0)
    with pytest.raises(ConfigurationError, match="empty"):
        evaluate(model, x[:0], y[:0])
    with pytest.raises(ConfigurationError, match="num_threads"):
        set_torch_threads(0)
    with pytest.raises(ConfigurationError, match="channels"):
        MnistCNN(channels=(0, 4))
