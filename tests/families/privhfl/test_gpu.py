"""PrivHFL's optional GPU path, tested on the CPU: exact limb matmul, device settings.

``limb_matmul`` (16-bit limbs in float64 GEMMs, what runs on CUDA) must be bit-identical to the
numba ``Z_2^64`` kernel; here it runs its torch GEMMs on the CPU, which proves the arithmetic
(the limb bound ``G_s < 2^53``), not the GPU. Device settings: ``"cpu"`` explicit, ``"auto"``
(the CPU here when CUDA is absent), and ``"cuda"`` refused with a ConfigurationError naming
the setting when there is no GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.ring import Z2_64
from flwr_fsl.families.privhfl import gpu
from flwr_fsl.families.privhfl.inference import error_bound, from_torch, plaintext_forward
from flwr_fsl.families.privhfl.mod import PrivHFLClient
from flwr_fsl.families.privhfl.protocol import PrivHFLConfig, SessionSeeds, secure_predict
from flwr_fsl.kernels import gpu as kernel_gpu
from flwr_fsl.models.privhfl import resolve_device, train_private

NO_CUDA = not torch.cuda.is_available()


def _full_range(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(0, 2**64 - 1, shape, dtype=np.uint64, endpoint=True)


@pytest.mark.parametrize(("p", "k", "o"), [(1, 1, 1), (7, 3, 5), (64, 576, 32), (9, 2304, 4)])
def test_limb_matmul_is_bit_identical_to_the_ring_kernel(p: int, k: int, o: int) -> None:
    rng = np.random.default_rng(p * k * o)
    a, b = _full_range(rng, (p, k)), _full_range(rng, (k, o))
    assert np.array_equal(gpu.limb_matmul(a, b, "cpu"), Z2_64.matmul(a, b))


def test_limb_matmul_worst_case_limbs_are_exact() -> None:
    """All-ones words (every limb 2^16 - 1) at a large K: the float64 sums stay exact."""
    k = 1 << 15
    a = np.full((3, k), 2**64 - 1, dtype=np.uint64)
    b = np.full((k, 2), 2**64 - 1, dtype=np.uint64)
    assert np.array_equal(gpu.limb_matmul(a, b, "cpu"), Z2_64.matmul(a, b))


def test_limb_matmul_refuses_what_it_cannot_do_exactly() -> None:
    a = np.zeros((1, 2), dtype=np.uint64)
    with pytest.raises(ConfigurationError):
        gpu.limb_matmul(a, np.zeros((3, 1), dtype=np.uint64), "cpu")
    with pytest.raises(ConfigurationError):
        signed = a.astype(np.int64)
        gpu.limb_matmul(signed, np.zeros((2, 1), dtype=np.uint64), "cpu")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="exact for K"):
        big = np.zeros((1, gpu.MAX_INNER), np.uint64)
        gpu.limb_matmul(big, big.T.copy(), "cpu")


def test_matmul_device_settings() -> None:
    try:
        gpu.set_matmul_device("cpu")
        assert gpu.matmul_device() == "cpu"
        gpu.set_matmul_device("auto")
        assert gpu.matmul_device() == ("cpu" if NO_CUDA else "cuda")
        for bad in ("tpu", "cuda:x", 3):
            with pytest.raises(ConfigurationError, match="matmul device"):
                gpu.set_matmul_device(bad)  # type: ignore[arg-type]
        if NO_CUDA:
            with pytest.raises(ConfigurationError, match="CUDA is not available"):
                gpu.set_matmul_device("cuda")
    finally:
        gpu.set_matmul_device("auto")


def test_secure_prediction_through_the_limb_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Π_Matmul product through limb_matmul (on the CPU): correct secure logits.

    (A session draws some fresh randomness, so two runs differ in the last unit; the
    products themselves are bit-identical: the tests above.)"""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 10)
    ).eval()
    model = from_torch(net, (1, 8, 8))
    x = np.random.default_rng(1).uniform(-1, 1, (3, 1, 8, 8))
    seeds = [SessionSeeds(b"a" * 16, b"b" * 16, b"c" * 16)]
    cfg = PrivHFLConfig()
    calls: list[int] = []
    try:
        gpu.set_matmul_device("cpu")
        plain = secure_predict([model], x, cfg, seeds=seeds).logits
        real = kernel_gpu.limb_matmul

        def counted(a: np.ndarray, b: np.ndarray, device: object) -> np.ndarray:
            calls.append(a.shape[0])
            return real(a, b, device)

        monkeypatch.setattr(kernel_gpu, "limb_matmul", counted)
        monkeypatch.setattr(kernel_gpu, "GPU_MIN_MACS", 0)
        monkeypatch.setattr(kernel_gpu, "MIN_INTENSITY", 0)
        kernel_gpu._STATE.setting = "cuda"
        kernel_gpu._STATE.device = torch.device("cpu")  # the GEMMs on the CPU
        limbs = secure_predict([model], x, cfg, seeds=seeds).logits
    finally:
        gpu.set_matmul_device("auto")
    assert len(calls) == 6  # two layers, three products each (Q's deal, A, S)
    expected = plaintext_forward(model, x)
    bound = error_bound(model, 1.0)
    for logits in (plain, limbs):
        assert np.max(np.abs(logits - expected)) <= bound


def _none(context: object) -> Any:
    return None


def test_training_device_setting() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu" if NO_CUDA else "cuda")
    for bad in ("tpu", "cuda:x", 1):
        with pytest.raises(ConfigurationError, match="device"):
            resolve_device(bad)  # type: ignore[arg-type]
    if NO_CUDA:
        with pytest.raises(ConfigurationError, match="CUDA is not available"):
            resolve_device("cuda")
        with pytest.raises(ConfigurationError, match="CUDA is not available"):
            PrivHFLClient(_none, _none).device = "cuda"
    client = PrivHFLClient(_none, _none)
    assert client.device == torch.device("cpu" if NO_CUDA else "cuda")  # "auto"
    client.device = "cpu"
    assert client.device == torch.device("cpu")


def test_explicit_cpu_training_equals_the_default_here() -> None:
    x = np.random.default_rng(2).uniform(0, 1, (40, 1, 28, 28)).astype(np.float32)
    y = np.arange(40) % 10
    losses = []
    for device in ("cpu", "auto"):
        torch.manual_seed(3)
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
        losses.append(train_private(net, x, y, epochs=2, batch_size=8, device=device))
        assert next(net.parameters()).device == torch.device("cpu")
    if NO_CUDA:
        assert losses[0] == losses[1]
