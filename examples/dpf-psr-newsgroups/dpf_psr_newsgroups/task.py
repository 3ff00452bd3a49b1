"""dpf-psr-newsgroups: the run settings, a client's documents and word rows, and the model.

The classifier is a bag of embeddings (fastText-like): a document ``x`` with word counts
``n_w`` is the weighted mean of its words' embeddings, and a linear map gives the logits::

    h(x) = sum_w a_w e_w / sum_w a_w,   a_w = log(1 + n_w),   logits = W h(x)

The model is two tensors: the table ``emb.weight`` of ``V x dim`` float32 word embeddings
``e_w`` (word id = frequency rank in the training documents) and the classifier
``head.weight`` of ``C x dim`` (the rows ``W_c`` of the ``C`` newsgroups). In index mode the
table is one row table and the head a dense tensor of the same secure round
(:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` with
:func:`model_tables`: PSR + row SSA for the words, dense SSA for the head); which *word* rows a
client holds is private.

A client's row set is fixed across rounds: its words, without the ``stop-words`` most frequent
ones of the vocabulary (a public stop list), ranked by how many of its documents contain them
(ties: the more frequent word first), cut to the public bound ``max-rows``. Its documents keep
only those words. Each row's averaging weight (count) is the number of the client's documents
that use it. Word embeddings start at zero (a word no client trained adds nothing to a
document's vector), the head at ``N(0, init-std)``.

Training is minibatch SGD on the summed cross-entropy; evaluation is centralized on the test
documents (the servers hold the model; the clients' row sets are what is private).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import load_newsgroups, newsgroups_clients
from flwr_fsl.data.newsgroups import BagOfWords
from flwr_fsl.run_config import settings_from_run_config
from flwr_fsl.submodel.tables import ModelTables

TABLE = "emb.weight"
HEAD = "head.weight"


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (in-process tests pass a partial run config).
    """

    num_server_rounds: int = 10
    fraction_train: float = 1.0
    fraction_evaluate: float = 0.0
    min_nodes: int = 2
    partitioning: str = "dirichlet"
    alpha: float = 1.0
    vocab_size: int = 0
    stop_words: int = 100
    dim: int = 16
    init_std: float = 0.1
    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.5
    max_rows: int = 2048
    test_docs: int = 0
    seed: int = 42
    ssa_helper_address: str = ""
    ssa_helper_fingerprint: str = ""
    ssa_helper_key_file: str = ""
    ssa_helper_token_file: str = ""
    ssa_helper_ca_file: str = ""
    ssa_frac_bits: int = 24
    ssa_max_abs: float = 1e5
    ssa_weighted: bool = False
    ssa_dp_noise_multiplier: float = 1.0
    ssa_dp_clip_norm: float = 1.0
    ssa_dp_budget_epsilon: float = 20.0
    compare_plaintext: bool = True
    results_dir: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1:
            problems.append("num-server-rounds must be >= 1")
        if not 0.0 < self.fraction_train <= 1.0:
            problems.append("fraction-train must be in (0, 1]")
        if self.fraction_evaluate != 0.0:
            problems.append("fraction-evaluate must be 0 (evaluation is centralized)")
        if self.min_nodes < 1:
            problems.append("min-nodes must be >= 1")
        if self.partitioning not in ("dirichlet", "iid") or not self.alpha > 0:
            problems.append("partitioning must be dirichlet or iid, alpha > 0")
        if self.vocab_size < 0 or self.stop_words < 0 or self.test_docs < 0:
            problems.append("vocab-size, stop-words and test-docs must be >= 0")
        if self.dim < 1 or self.local_epochs < 1 or self.batch_size < 1:
            problems.append("dim, local-epochs and batch-size must be >= 1")
        if not (self.lr > 0 and self.init_std >= 0):
            problems.append("lr must be > 0, init-std >= 0")
        if self.max_rows < 1:
            problems.append("max-rows must be >= 1")
        if not 1 <= self.ssa_frac_bits <= 40 or not self.ssa_max_abs > 0:
            problems.append("ssa-frac-bits must be in [1, 40], ssa-max-abs > 0")
        if not (self.ssa_dp_noise_multiplier >= 0 and self.ssa_dp_budget_epsilon >= 0):
            problems.append("ssa-dp-noise-multiplier and ssa-dp-budget-epsilon must be >= 0")
        if not self.ssa_dp_clip_norm > 0:
            problems.append("ssa-dp-clip-norm must be > 0")
        if self.seed < 0:
            problems.append("seed must be >= 0")
        if problems:
            raise ConfigurationError("invalid run config: " + "; ".join(problems))

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read the settings from a run config (keys spelled with dashes; unknown ones ignored).

        Raises
        ------
        ConfigurationError
            If a value has the wrong type or is out of range (the message names the key).
        """
        return settings_from_run_config(cls, run_config)


class Shape(NamedTuple):
    """The model's layout: ``num_words`` word rows in the table, ``num_classes`` head rows."""

    num_words: int
    num_classes: int

    @property
    def rows(self) -> int:
        """Rows of the table (the words)."""
        return self.num_words


def model_tables(settings: Settings) -> ModelTables:
    """Return the model's row tables: the word table, ``max-rows`` rows per client.

    The head (every other tensor) is dense.
    """
    return ModelTables.single(TABLE, settings.max_rows)


def table_shape(settings: Settings) -> Shape:
    """Return the table layout: the ``vocab-size`` most frequent words (0: all), the groups.

    Raises
    ------
    DataNotPreparedError
        If 20 Newsgroups has not been prepared (``python -m flwr_fsl.data prepare newsgroups``).
    """
    data = load_newsgroups()
    words = data.num_words if settings.vocab_size == 0 else min(settings.vocab_size, data.num_words)
    return Shape(words, data.num_classes)


def restrict(bag: BagOfWords, keep: NDArray[np.bool_]) -> BagOfWords:
    """Return ``bag`` with only the words ``w`` where ``keep[w]`` (documents stay, maybe empty)."""
    mask = keep[bag.words]
    doc = np.repeat(np.arange(len(bag)), np.diff(bag.indptr))[mask]
    indptr = np.zeros(len(bag) + 1, np.int64)
    np.cumsum(np.bincount(doc, minlength=len(bag)), out=indptr[1:])
    return BagOfWords(indptr, bag.words[mask], bag.counts[mask], bag.labels)


class ClientData(NamedTuple):
    """One client's documents and its fixed row set.

    Attributes
    ----------
    rows : numpy.ndarray
        Sorted row ids of its chosen words (at most ``max_rows``), int64.
    counts : numpy.ndarray
        Averaging weight of each row: documents using the word.
    docs : BagOfWords
        Its training documents, restricted to the chosen words.
    words : int
        Distinct words of its documents inside the vocabulary before the cut.
    """

    rows: NDArray[np.int64]
    counts: NDArray[np.float64]
    docs: BagOfWords
    words: int


@lru_cache(maxsize=64)
def client_data(partition_id: int, num_partitions: int, settings: Settings) -> ClientData:
    """Return one client's documents and row set (module docstring; cached per process).

    Raises
    ------
    ValueError
        If ``partition_id`` is out of range.
    DataNotPreparedError
        If 20 Newsgroups has not been prepared.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, {num_partitions}), got {partition_id}")
    shape = table_shape(settings)
    parts = newsgroups_clients(
        num_partitions, partitioning=settings.partitioning, alpha=settings.alpha, seed=settings.seed
    )
    bag = load_newsgroups().train.subset(parts[partition_id])
    bag = restrict(bag, np.arange(load_newsgroups().num_words) < shape.num_words)
    df = np.bincount(bag.words, minlength=shape.num_words)
    used = int(np.count_nonzero(df))
    df[: settings.stop_words] = 0
    candidates = np.flatnonzero(df)
    ranked = candidates[np.lexsort((candidates, -df[candidates]))]
    words = np.sort(ranked[: settings.max_rows])
    keep = np.zeros(load_newsgroups().num_words, bool)
    keep[words] = True
    rows = words.astype(np.int64)
    counts = df[words].astype(np.float64)
    out = ClientData(rows, counts, restrict(bag, keep), used)
    for array in (out.rows, out.counts):
        array.setflags(write=False)
    return out


def initial_model(settings: Settings) -> dict[str, NDArray[np.float32]]:
    """Return the initial model: zero word rows, an ``N(0, init-std)`` head (seeded)."""
    shape = table_shape(settings)
    table = np.zeros((shape.rows, settings.dim), np.float32)
    rng = np.random.default_rng([settings.seed, 0])
    head = rng.normal(0.0, settings.init_std, (shape.num_classes, settings.dim))
    return {TABLE: table, HEAD: head.astype(np.float32)}


def _weights(bag: BagOfWords) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Return each entry's document and its weight ``a_w / sum a`` in that document."""
    doc = np.repeat(np.arange(len(bag)), np.diff(bag.indptr))
    a = np.log1p(bag.counts.astype(np.float64))
    total = np.bincount(doc, a, minlength=len(bag))
    return doc, a / np.maximum(total[doc], 1e-12)


def doc_vectors(
    table: NDArray[np.floating], bag: BagOfWords, num_words: int
) -> NDArray[np.float64]:
    """Return ``h(x)`` of every document (words at or beyond ``num_words`` are ignored)."""
    if bag.words.size and int(bag.words.max()) >= num_words:
        bag = restrict(bag, np.arange(int(bag.words.max()) + 1) < num_words)
    doc, weight = _weights(bag)
    out = np.zeros((len(bag), table.shape[1]))
    np.add.at(out, doc, weight[:, None] * table[bag.words].astype(np.float64))
    return out


def evaluate(
    table: NDArray[np.floating], head: NDArray[np.floating], bag: BagOfWords, shape: Shape
) -> tuple[float, float]:
    """Return the mean cross-entropy and the accuracy of the model on ``bag``."""
    logits = doc_vectors(table, bag, shape.num_words) @ head.T.astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = float(-np.mean(log_p[np.arange(len(bag)), bag.labels]))
    return loss, float(np.mean(np.argmax(logits, axis=1) == bag.labels))


@lru_cache(maxsize=2)
def test_documents(settings: Settings) -> BagOfWords:
    """Return the test documents of the centralized evaluation (``test-docs`` evenly spaced).

    The test file is ordered by newsgroup, so a subset takes every ``n / test-docs``-th one.
    """
    test = load_newsgroups().test
    if settings.test_docs and settings.test_docs < len(test):
        picks = np.linspace(0, len(test) - 1, settings.test_docs).round().astype(np.int64)
        return test.subset(np.unique(picks))
    return test


def train_client(
    table: NDArray[np.float32],
    head: NDArray[np.float32],
    data: ClientData,
    shape: Shape,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> tuple[NDArray[np.float32], NDArray[np.float32], float]:
    """Train the client's word rows and the head with minibatch SGD on the summed cross-entropy.

    Only the rows of ``data.rows`` change in the table.

    Parameters
    ----------
    table : numpy.ndarray
        The ``(V, dim)`` table (not modified; a trained copy is returned). Rows outside
        ``data.rows`` are not read.
    head : numpy.ndarray
        The ``(C, dim)`` classifier (not modified; a trained copy is returned).
    data : ClientData
        The client's documents and rows.
    shape : Shape
        The table layout.
    epochs, lr, batch_size, seed
        Local epochs, step size, documents per step, shuffle seed.

    Returns
    -------
    tuple
        ``(trained_table, trained_head, mean loss of the last epoch)``.

    Raises
    ------
    ValueError
        If the table does not have the layout's rows.
    """
    if table.ndim != 2 or table.shape[0] != shape.rows:
        raise ValueError(f"the table has shape {table.shape}, expected ({shape.rows}, dim)")
    words = data.rows
    local = np.full(shape.rows, -1, np.int64)
    local[words] = np.arange(words.size)
    emb = table[words].astype(np.float64)
    head = head.astype(np.float64)
    bag = data.docs
    _, weight = _weights(bag)
    entry_word = local[bag.words]
    rng = np.random.default_rng(seed)
    loss = 0.0
    n = len(bag)
    for _ in range(epochs):
        loss = 0.0
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            docs = order[start : start + batch_size]
            lo, hi = bag.indptr[docs], bag.indptr[docs + 1]
            take = np.repeat(lo - np.cumsum(np.r_[0, hi - lo])[:-1], hi - lo) + np.arange(
                int((hi - lo).sum())
            )
            row_of = np.repeat(np.arange(docs.size), hi - lo)
            contrib = weight[take, None] * emb[entry_word[take]]
            h = np.zeros((docs.size, emb.shape[1]))
            np.add.at(h, row_of, contrib)
            logits = h @ head.T
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            labels = bag.labels[docs]
            loss -= float(np.log(np.maximum(p[np.arange(docs.size), labels], 1e-300)).sum())
            p[np.arange(docs.size), labels] -= 1.0  # d(summed loss)/d logits
            grad_head = p.T @ h
            grad_h = p @ head
            grad_emb = np.zeros_like(emb)
            np.add.at(grad_emb, entry_word[take], weight[take, None] * grad_h[row_of])
            head -= lr * grad_head
            emb -= lr * grad_emb
        loss /= max(1, n)
    out = table.copy()
    out[words] = emb.astype(np.float32)
    return out, head.astype(np.float32), loss
