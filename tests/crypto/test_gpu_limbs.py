"""The GPU path of the ``F_p`` products (``kernels.gpu.field_limb_matmul``), proven on the CPU.

Two 16-bit limbs per canonical element in float64 GEMMs, reduced mod ``p`` by Horner's rule:
the result must be bit-identical to the numba kernel (``kernels.field.matmul_mod``) for every
prime ``p < 2^32``, shape and value, the worst-case limbs at the largest inner size the float64
bound allows included. Here torch runs the GEMMs on the CPU, which proves the arithmetic, not
the GPU (``benchmarks/sesa_gpu_check.py`` checks the GPU's words on a GPU machine). Also: what
it refuses, when a product is offloaded, and that ``PrimeField.matmul`` and SESA's mask
evaluations take the path and give the same words.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.ring import SESA_PRIME, Z2_64, PrimeField
from flwr_fsl.families.sesa.coding import mask_evaluations
from flwr_fsl.kernels import gpu
from flwr_fsl.kernels.field import mask_evaluations_mod, matmul_mod

torch = pytest.importorskip("torch")

PRIMES = (3, 65_521, 65_537, 2_147_483_647, SESA_PRIME)


def _numba(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.uint64)
    matmul_mod(a, b, np.uint64(p), np.uint64((1 << 64) % p), out)
    return out


@st.composite
def _operands(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    p = draw(st.sampled_from(PRIMES))
    m, k, n = (draw(st.integers(1, 24)) for _ in range(3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    a = rng.integers(0, p, (m, k), dtype=np.uint64)
    b = rng.integers(0, p, (k, n), dtype=np.uint64)
    # Extremes where the limbs are largest: p - 1 and 0 in random places.
    for x in (a, b):
        x[rng.random(x.shape) < draw(st.sampled_from([0.0, 0.3, 1.0]))] = p - 1
        x[rng.random(x.shape) < 0.1] = 0
    return a, b, p


@given(_operands())
def test_field_limbs_are_bit_identical_to_the_numba_kernel(
    ops: tuple[np.ndarray, np.ndarray, int],
) -> None:
    a, b, p = ops
    assert np.array_equal(gpu.field_limb_matmul(a, b, p, "cpu"), _numba(a, b, p))


def test_worst_case_limbs_at_the_largest_inner_size_are_exact() -> None:
    # K = 2^20 - 1 products of (p - 1)^2: G_1 reaches 2 K (2^16 - 1)(2^16 - 6) < 2^53.
    k = gpu.MAX_INNER_FIELD - 1
    for p in (SESA_PRIME, 2_147_483_647):
        a = np.full((2, k), p - 1, dtype=np.uint64)
        b = np.full((k, 3), p - 1, dtype=np.uint64)
        want = _numba(a, b, p)
        assert int(want[0, 0]) == (k * (p - 1) ** 2) % p
        assert np.array_equal(gpu.field_limb_matmul(a, b, p, "cpu"), want)


def test_field_limbs_refuse_what_they_cannot_do_exactly() -> None:
    a = np.ones((2, 3), dtype=np.uint64)
    b = np.ones((3, 2), dtype=np.uint64)
    with pytest.raises(ConfigurationError, match="uint64 matrices"):
        gpu.field_limb_matmul(a, np.ones((2, 2), dtype=np.uint64), SESA_PRIME, "cpu")
    with pytest.raises(ConfigurationError, match="uint64 matrices"):
        gpu.field_limb_matmul(a.astype(np.int64), b, SESA_PRIME, "cpu")  # type: ignore[arg-type]
    for p in (1, 1 << 32, True, 7.0):
        with pytest.raises(ConfigurationError, match="modulus"):
            gpu.field_limb_matmul(a, b, p, "cpu")  # type: ignore[arg-type]
    for bad in (7, 1 << 40, (1 << 64) - 1):  # not canonical mod 7: the limb bound would break
        big = a.copy()
        big[1, 2] = bad
        with pytest.raises(ConfigurationError, match="canonical"):
            gpu.field_limb_matmul(big, b, 7, "cpu")
        with pytest.raises(ConfigurationError, match="canonical"):
            gpu.field_limb_matmul(b.T.copy(), big.T.copy(), 7, "cpu")
    wide = np.zeros((1, gpu.MAX_INNER_FIELD), dtype=np.uint64)
    with pytest.raises(ConfigurationError, match="exact for K"):
        gpu.field_limb_matmul(wide, wide.T.copy(), SESA_PRIME, "cpu")


def test_read_only_operands_are_copied_not_refused() -> None:
    a = np.arange(12, dtype=np.uint64).reshape(3, 4)
    b = np.arange(8, dtype=np.uint64).reshape(4, 2)
    a.flags.writeable = False
    assert np.array_equal(gpu.field_limb_matmul(a, b, 13, "cpu"), _numba(a, b, 13))


def test_offload_only_large_dense_products_and_never_under_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu._STATE, "setting", "cpu")
    monkeypatch.setattr(gpu._STATE, "device", "cpu")
    assert gpu.offload_device(4096, 4096, 4096) is None
    monkeypatch.setattr(gpu._STATE, "setting", "cuda")
    monkeypatch.setattr(gpu._STATE, "device", torch.device("cpu"))
    assert gpu.offload_device(100, 51, 39_751, 4) == torch.device("cpu")  # SESA's coding
    assert gpu.offload_device(40, 54, 39_751) == torch.device("cpu")  # SESA's decode
    assert gpu.offload_device(1, 400, 39_751) is None  # psi: one word moved per multiply-add
    assert gpu.offload_device(6144, 27, 64) is None  # PrivHFL's first layer: 19 per word
    assert gpu.offload_device(6144, 576, 64) == torch.device("cpu")
    assert gpu.offload_device(64, 64, 64) is None  # 2^18 < GPU_MIN_MACS multiply-adds
    assert gpu.offload_device(256, 256, 64) == torch.device("cpu")  # 2^22: dense enough


def test_auto_without_an_nvidia_device_stays_on_the_cpu_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from flwr_fsl.kernels import gpu\n"
        "gpu._NVIDIA_NODES = '/nonexistent/nvidia[0-9]*'\n"
        "assert gpu.offload_device(4096, 4096, 4096) is None and gpu.matmul_device() == 'cpu'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_prime_field_matmul_takes_the_limb_path_with_the_same_words(
    field_limbs_on_cpu: list[tuple[int, int, int]],
) -> None:
    f = PrimeField()
    rng = np.random.default_rng(3)
    a = rng.integers(0, f.p, (9, 54), dtype=np.uint64)
    b = rng.integers(0, f.p, (54, 301), dtype=np.uint64)
    assert np.array_equal(f.matmul(a, b), _numba(a, b, f.p))
    assert field_limbs_on_cpu == [(9, 54, 301)]


def test_mask_evaluations_on_the_limb_path_equal_the_fused_kernel(
    field_limbs_on_cpu: list[tuple[int, int, int]],
) -> None:
    f = PrimeField()
    rng = np.random.default_rng(4)
    j, k_total, t, d = 11, 6, 5, 777
    basis = rng.integers(0, f.p, (j, k_total + t), dtype=np.uint64)
    r = rng.integers(0, f.p, (3, d), dtype=np.uint64)
    v = rng.integers(0, f.p, (t, 3, d), dtype=np.uint64)
    chosen = (4, 0, 2)
    extra = np.ascontiguousarray(basis[:, k_total:])
    sel = np.ascontiguousarray(basis[:, list(chosen)])
    want = np.empty((j, 3, d), dtype=np.uint64)
    mask_evaluations_mod(extra, sel, v, r, np.uint64(f.p), np.uint64((1 << 64) % f.p), want)
    assert np.array_equal(mask_evaluations(f, basis, chosen, r, v), want)
    assert field_limbs_on_cpu == [(j, t + 1, d)] * 3  # one GEMM per slot


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU machine)")
def test_the_gpu_gives_the_numba_words() -> None:
    rng = np.random.default_rng(6)
    cuda = torch.device("cuda")
    for p in PRIMES:
        a = rng.integers(0, p, (37, 611), dtype=np.uint64)
        b = rng.integers(0, p, (611, 1023), dtype=np.uint64)
        assert np.array_equal(gpu.field_limb_matmul(a, b, p, cuda), _numba(a, b, p))
        a[:], b[:] = p - 1, p - 1
        assert np.array_equal(gpu.field_limb_matmul(a, b, p, cuda), _numba(a, b, p))
    a = rng.integers(0, 2**64 - 1, (37, 611), dtype=np.uint64, endpoint=True)
    b = rng.integers(0, 2**64 - 1, (611, 1023), dtype=np.uint64, endpoint=True)
    assert np.array_equal(gpu.limb_matmul(a, b, cuda), Z2_64.matmul(a, b))
