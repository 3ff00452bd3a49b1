"""PrivHFL query sets: expand a client's private images into a pool, then select queries from it.

PrivHFL (Sun et al., §3.2, App. B.1, App. C.3) has no auxiliary data set: a querier builds a
large unlabeled pool from its own private images and asks the other clients' models for soft
labels on a subset of it. This module is that step, on numpy arrays (no torch, no Flower): the
querier's own model outputs (class probabilities, penultimate features) come in as arrays.

**Expansion** (:func:`expand`, returning a :class:`QueryPool` that records where each sample
came from, so mixed labels can be computed — :meth:`QueryPool.mixed_labels`):

* ``"mixup"`` (Eq. 1): ``x = lam * x_i + (1 - lam) * x_j`` for pairs ``i != j`` drawn uniformly,
  each pair with every ``lam`` of :data:`MIXUP_LAMBDAS` = 0.1, 0.2, ..., 0.9 ("with an interval
  of 0.1 ... to generate more diverse synthetic images", §3.2 / App. B.3), in random order.
* ``"cutmix"`` (Yun et al. 2019, App. B.1's ``M * x_i + (1 - M) * x_j``): a box of ``x_j`` pasted
  into ``x_i``. For a target ``lam`` from :data:`MIXUP_LAMBDAS`, the box has the image's aspect
  ratio and sides ``round(H * sqrt(1 - lam))`` by ``round(W * sqrt(1 - lam))`` (Yun et al.'s
  ``r_w = W sqrt(1 - lam)``), at a uniform position *fully inside* the image (Yun et al. clip a
  box centred anywhere, which shrinks it at the borders; keeping it inside makes the area
  follow ``lam`` up to rounding). The recorded ``lam`` is the exact fraction of pixels taken
  from ``x_i``: ``1 - box area / (H W)``.
* ``"cutout"`` (DeVries & Taylor 2017): one rectangle of the image set to ``value`` (0). The
  rectangle is drawn exactly as torchvision's ``RandomErasing(p=1, scale=(0.02, 0.33),
  ratio=(0.3, 3.3), value=0)`` draws it — area ``H W * U(scale)``, aspect ``exp(U(log ratio))``,
  ``h = round(sqrt(area * aspect))``, ``w = round(sqrt(area / aspect))``, up to 10 tries for a
  rectangle with ``h < H`` and ``w < W``, uniform position inside the image, and no erasing if
  every try fails. torchvision is not a dependency here (pip pairs it only with a ~5.5 GB
  torch build), so this is a re-implementation of that algorithm, not a call to it.
* ``"private"``: the private images themselves (the paper's "private data-based query", the
  knowledge-distillation alternative it compares against).

**Selection** (:func:`select`, App. C.3, following CaPC): ``"random"`` (what Table 1 uses),
and the active-learning strategies on the querier's own model:

* ``"entropy"`` (Def. 2): the ``k`` samples of highest predictive entropy
  ``-sum_c p_c log p_c``;
* ``"margin"`` (Def. 1, on probabilities as in CaPC): the ``k`` smallest gaps between the two
  largest class probabilities — the samples closest to a decision boundary;
* ``"least_confidence"``: the ``k`` smallest top-class probabilities;
* ``"kcenter"`` (Def. 3, Sener & Savarese 2018): greedy k-center in feature space — each step
  takes the pool point farthest from its nearest center, the centers being the points chosen
  so far plus an optional ``existing`` set (the querier's training data, ``s^0``). Greedy is a
  2-approximation of the k-center objective (Gonzalez 1985);
* ``"icd"`` (informative-and-diverse): k-means clusters of the features; ``k`` is split over
  the clusters in proportion to their sizes (largest remainder), and each cluster gives its
  lowest-margin points — "highest uncertainty lowest margin points while maintaining same
  distribution over clusters as entire dataset".

Ties break toward the lower pool index, so a selection is a deterministic function of its
inputs and ``seed``. Every random choice comes from ``numpy.random.default_rng(seed)``.

**Privacy.** None here: a mixup, cutmix or cutout image shows its source images (App. G,
Fig. 19). The pool never leaves the querier in the clear in the secure workflow: queries are
secret-shared (:mod:`flwr_fsl.families.privhfl.protocol`). The ``seed`` decides every pair,
``lam``, box and selected index: whoever knows it and the number of private images knows
which images each query mixes, so the Flower client passes a seed of its own
(:meth:`~flwr_fsl.families.privhfl.mod.PrivHFLClient.query_seed`), never the server's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "CUTOUT_RATIO",
    "CUTOUT_SCALE",
    "EXPANSIONS",
    "MIXUP_LAMBDAS",
    "STRATEGIES",
    "QueryPool",
    "cutmix_pool",
    "cutout_pool",
    "entropy",
    "expand",
    "greedy_k_center",
    "icd",
    "kmeans",
    "least_confidence",
    "margin",
    "mixup",
    "mixup_pool",
    "private_pool",
    "select",
    "softmax",
    "top_k",
]

MIXUP_LAMBDAS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 10))
"""PrivHFL's mixup coefficients: 0.1, 0.2, ..., 0.9."""

CUTOUT_SCALE: tuple[float, float] = (0.02, 0.33)
"""torchvision ``RandomErasing``'s default range of the erased fraction of the image."""

CUTOUT_RATIO: tuple[float, float] = (0.3, 3.3)
"""torchvision ``RandomErasing``'s default range of the erased rectangle's aspect ratio."""

Expansion = Literal["private", "mixup", "cutmix", "cutout"]
Strategy = Literal["random", "entropy", "margin", "least_confidence", "kcenter", "icd"]
EXPANSIONS: tuple[str, ...] = ("private", "mixup", "cutmix", "cutout")
STRATEGIES: tuple[str, ...] = ("random", "entropy", "margin", "least_confidence", "kcenter", "icd")

_CUTOUT_TRIES = 10  # torchvision RandomErasing.get_params


@dataclass(frozen=True)
class QueryPool:
    """An expanded pool: images and where each came from.

    Attributes
    ----------
    images : numpy.ndarray
        float32 ``(P, *image_shape)``.
    first, second : numpy.ndarray
        int64 ``(P,)``: the private samples ``x_i`` and ``x_j`` each image mixes (``second ==
        first`` for ``"private"`` and ``"cutout"``).
    lam : numpy.ndarray
        float64 ``(P,)``: the weight of ``x_i`` (mixup's coefficient; cutmix's fraction of pixels
        from ``x_i``; 1 for ``"private"`` and ``"cutout"``).
    boxes : numpy.ndarray
        int64 ``(P, 4)``: ``(top, left, height, width)`` of the cutmix or cutout rectangle,
        ``(0, 0, 0, 0)`` where there is none.
    method : str
        The expansion that made the pool.
    """

    images: NDArray[np.float32]
    first: NDArray[np.int64]
    second: NDArray[np.int64]
    lam: NDArray[np.float64]
    boxes: NDArray[np.int64]
    method: str

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def take(self, indices: NDArray[np.integer]) -> QueryPool:
        """Return the sub-pool at ``indices`` (e.g. the output of :func:`select`)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(self))):
            raise ConfigurationError("indices must be a 1-D array of pool positions")
        return QueryPool(
            self.images[idx],
            self.first[idx],
            self.second[idx],
            self.lam[idx],
            self.boxes[idx],
            self.method,
        )

    def mixed_labels(self, labels: NDArray[np.integer], num_classes: int) -> NDArray[np.float64]:
        """Return ``lam * onehot(y_i) + (1 - lam) * onehot(y_j)`` per pool image.

        The mixup / cutmix label (Zhang et al. 2018; Yun et al. 2019) from the private labels;
        PrivHFL's querier does not train on these (it asks for soft labels instead), but they
        state what each image is made of.

        Parameters
        ----------
        labels : numpy.ndarray
            The private labels the pool was expanded from.
        num_classes : int
            Number of classes.

        Returns
        -------
        numpy.ndarray
            float64 ``(P, num_classes)``, rows summing to 1.
        """
        y = np.asarray(labels)
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise ConfigurationError("labels must be a 1-D integer array")
        if len(self) and max(int(self.first.max()), int(self.second.max())) >= len(y):
            raise ConfigurationError("labels is shorter than the private set the pool came from")
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise ConfigurationError(f"labels must lie in [0, {num_classes})")
        out = np.zeros((len(self), num_classes), dtype=np.float64)
        rows = np.arange(len(self))
        np.add.at(out, (rows, y[self.first]), self.lam)
        np.add.at(out, (rows, y[self.second]), 1.0 - self.lam)
        return out


# -- checks ---------------------------------------------------------------------------------------
def _images(x: NDArray[np.floating]) -> NDArray[np.float32]:
    a = np.asarray(x)
    if a.ndim < 3:
        raise ConfigurationError(f"x must be images (N, H, W) or (N, C, H, W), got shape {a.shape}")
    if a.shape[0] == 0:
        raise ConfigurationError("x must hold at least one image")
    if not np.issubdtype(a.dtype, np.floating) or not np.isfinite(a).all():
        raise ConfigurationError("x must hold finite floating-point pixels")
    return a.astype(np.float32, copy=False)


def _count(name: str, value: int, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigurationError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _lambdas(lambdas: tuple[float, ...] | list[float]) -> NDArray[np.float64]:
    lam = np.asarray(lambdas, dtype=np.float64)
    if lam.ndim != 1 or lam.size == 0 or not np.all((lam > 0) & (lam < 1)):
        raise ConfigurationError("lambdas must be a non-empty sequence of numbers in (0, 1)")
    return lam


def _pairs(n: int, count: int, rng: np.random.Generator) -> tuple[NDArray[np.int64], ...]:
    if n < 2:
        raise ConfigurationError("mixing needs at least two private images")
    i = rng.integers(0, n, size=count)
    j = rng.integers(0, n - 1, size=count)
    j = j + (j >= i)  # uniform over j != i
    return i.astype(np.int64), j.astype(np.int64)


def _probs(probs: NDArray[np.floating] | None) -> NDArray[np.float64]:
    if probs is None:
        raise ConfigurationError("this strategy needs the querier's class probabilities (probs)")
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ConfigurationError(f"probs must be (pool size, classes >= 2), got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or not np.allclose(p.sum(1), 1.0, atol=1e-4):
        raise ConfigurationError("each row of probs must be a probability vector")
    return p


def _features(features: NDArray[np.floating] | None, name: str = "features") -> NDArray[np.float64]:
    if features is None:
        raise ConfigurationError(f"this strategy needs {name} (the querier's feature vectors)")
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or not np.isfinite(f).all():
        raise ConfigurationError(f"{name} must be a finite 2-D array (points, dimensions)")
    return f


# -- expansion ------------------------------------------------------------------------------------
def mixup(
    x_i: NDArray[np.floating], x_j: NDArray[np.floating], lam: float | NDArray[np.floating]
) -> NDArray[np.float32]:
    """Return ``lam * x_i + (1 - lam) * x_j`` (PrivHFL Eq. 1), broadcasting ``lam`` per image."""
    a, b = np.asarray(x_i, dtype=np.float32), np.asarray(x_j, dtype=np.float32)
    if a.shape != b.shape:
        raise ConfigurationError(f"x_i and x_j must have one shape, got {a.shape} and {b.shape}")
    lam_arr = np.asarray(lam, dtype=np.float32)
    if lam_arr.ndim == 1:
        lam_arr = lam_arr.reshape((-1,) + (1,) * (a.ndim - 1))
    return (lam_arr * a + (np.float32(1) - lam_arr) * b).astype(np.float32)


def private_pool(x: NDArray[np.floating]) -> QueryPool:
    """Return the private images themselves as the pool (the paper's private-data queries)."""
    images = _images(x).copy()
    idx = np.arange(len(images), dtype=np.int64)
    ones = np.ones(len(images))
    return QueryPool(images, idx, idx.copy(), ones, np.zeros((len(images), 4), np.int64), "private")


def mixup_pool(
    x: NDArray[np.floating],
    size: int,
    seed: int = 0,
    lambdas: tuple[float, ...] | list[float] = MIXUP_LAMBDAS,
) -> QueryPool:
    """Expand ``x`` by mixup: ``ceil(size / len(lambdas))`` random pairs, each with every ``lam``.

    Parameters
    ----------
    x : numpy.ndarray
        Private images ``(N, ...)``, ``N >= 2``.
    size : int
        Pool size (the last pair may contribute fewer than ``len(lambdas)`` images).
    seed : int
        Seed of the pairs and of the order.
    lambdas : sequence of float
        Coefficients in ``(0, 1)``; default :data:`MIXUP_LAMBDAS`.

    Returns
    -------
    QueryPool
        ``size`` images in random order.
    """
    images = _images(x)
    size = _count("size", size)
    lam_set = _lambdas(lambdas)
    rng = np.random.default_rng(seed)
    num_pairs = -(-size // len(lam_set))
    i, j = _pairs(len(images), num_pairs, rng)
    first = np.repeat(i, len(lam_set))[:size]
    second = np.repeat(j, len(lam_set))[:size]
    lam = np.tile(lam_set, num_pairs)[:size]
    order = rng.permutation(size)
    first, second, lam = first[order], second[order], lam[order]
    out = mixup(images[first], images[second], lam)
    return QueryPool(out, first, second, lam, np.zeros((size, 4), np.int64), "mixup")


def cutmix_pool(
    x: NDArray[np.floating],
    size: int,
    seed: int = 0,
    lambdas: tuple[float, ...] | list[float] = MIXUP_LAMBDAS,
) -> QueryPool:
    """Expand ``x`` by cutmix: a box of ``x_j`` pasted into ``x_i`` (module docstring).

    Parameters
    ----------
    x : numpy.ndarray
        Private images ``(N, ..., H, W)``, ``N >= 2``; the box spans the last two axes.
    size : int
        Pool size.
    seed : int
        Seed of pairs, target ``lam`` and box positions.
    lambdas : sequence of float
        Target fractions of ``x_i``, each drawn uniformly per image; default
        :data:`MIXUP_LAMBDAS`.

    Returns
    -------
    QueryPool
        With ``lam`` the exact fraction of pixels from ``x_i`` and the boxes.
    """
    images = _images(x)
    size = _count("size", size)
    lam_set = _lambdas(lambdas)
    rng = np.random.default_rng(seed)
    first, second = _pairs(len(images), size, rng)
    target = lam_set[rng.integers(0, len(lam_set), size=size)]
    height, width = images.shape[-2:]
    cut = np.sqrt(1.0 - target)
    box_h = np.clip(np.rint(height * cut), 0, height).astype(np.int64)
    box_w = np.clip(np.rint(width * cut), 0, width).astype(np.int64)
    top = (rng.random(size) * (height - box_h + 1)).astype(np.int64)
    left = (rng.random(size) * (width - box_w + 1)).astype(np.int64)
    out = images[first].copy()
    for n in range(size):
        rows = slice(top[n], top[n] + box_h[n])
        cols = slice(left[n], left[n] + box_w[n])
        out[n, ..., rows, cols] = images[second[n], ..., rows, cols]
    lam = 1.0 - (box_h * box_w) / float(height * width)
    boxes = np.stack([top, left, box_h, box_w], axis=1)
    return QueryPool(out, first, second, lam, boxes, "cutmix")


def cutout_pool(
    x: NDArray[np.floating],
    size: int,
    seed: int = 0,
    scale: tuple[float, float] = CUTOUT_SCALE,
    ratio: tuple[float, float] = CUTOUT_RATIO,
    value: float = 0.0,
) -> QueryPool:
    """Expand ``x`` by cutout: one erased rectangle per image, drawn as ``RandomErasing`` does.

    Parameters
    ----------
    x : numpy.ndarray
        Private images ``(N, ..., H, W)``.
    size : int
        Pool size; each image is a uniformly drawn private image with its own rectangle.
    seed : int
        Seed of the source images and the rectangles.
    scale : tuple[float, float]
        Range of the erased fraction of the image, ``0 < lo <= hi <= 1``.
    ratio : tuple[float, float]
        Range of the rectangle's aspect ratio (height / width), ``0 < lo <= hi``.
    value : float
        The erased pixels' value.

    Returns
    -------
    QueryPool
        With the rectangles (``(0, 0, 0, 0)`` where all 10 tries failed and nothing was erased).
    """
    images = _images(x)
    size = _count("size", size)
    lo, hi = (float(s) for s in scale)
    if not 0.0 < lo <= hi <= 1.0:
        raise ConfigurationError(f"scale must satisfy 0 < lo <= hi <= 1, got {scale}")
    r_lo, r_hi = (float(r) for r in ratio)
    if not 0.0 < r_lo <= r_hi or not math.isfinite(r_hi):
        raise ConfigurationError(f"ratio must satisfy 0 < lo <= hi, got {ratio}")
    if not math.isfinite(value):
        raise ConfigurationError("value must be finite")
    rng = np.random.default_rng(seed)
    first = rng.integers(0, len(images), size=size).astype(np.int64)
    height, width = images.shape[-2:]
    area = float(height * width)
    log_ratio = (math.log(r_lo), math.log(r_hi))
    out = images[first].copy()
    boxes = np.zeros((size, 4), dtype=np.int64)
    for n in range(size):
        for _ in range(_CUTOUT_TRIES):
            erase_area = area * rng.uniform(lo, hi)
            aspect = math.exp(rng.uniform(*log_ratio))
            h = round(math.sqrt(erase_area * aspect))
            w = round(math.sqrt(erase_area / aspect))
            if not (h < height and w < width):
                continue
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            out[n, ..., top : top + h, left : left + w] = value
            boxes[n] = (top, left, h, w)
            break
    return QueryPool(out, first, first.copy(), np.ones(size), boxes, "cutout")


def expand(
    x: NDArray[np.floating],
    method: Expansion | str,
    size: int | None = None,
    seed: int = 0,
) -> QueryPool:
    """Expand the private images ``x`` into a query pool by ``method``.

    Parameters
    ----------
    x : numpy.ndarray
        Private images ``(N, ...)``.
    method : str
        One of :data:`EXPANSIONS`.
    size : int, optional
        Pool size (ignored for ``"private"``, whose pool is ``x``); required otherwise.
    seed : int
        Seed of every random choice.

    Returns
    -------
    QueryPool
        The pool.

    Raises
    ------
    ConfigurationError
        If ``method`` is unknown or an argument is invalid.
    """
    if method == "private":
        return private_pool(x)
    if method not in EXPANSIONS:
        raise ConfigurationError(f"unknown expansion {method!r}; choose one of {EXPANSIONS}")
    if size is None:
        raise ConfigurationError(f"expansion {method!r} needs a pool size")
    if method == "mixup":
        return mixup_pool(x, size, seed)
    if method == "cutmix":
        return cutmix_pool(x, size, seed)
    return cutout_pool(x, size, seed)


# -- selection ------------------------------------------------------------------------------------
def softmax(logits: NDArray[np.floating], temperature: float = 1.0) -> NDArray[np.float64]:
    """Return the row-wise softmax of ``logits / temperature`` (shifted, so it never overflows)."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or not np.isfinite(z).all():
        raise ConfigurationError("logits must be a finite 2-D array")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigurationError(f"temperature must be a finite number > 0, got {temperature!r}")
    z = z / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def entropy(probs: NDArray[np.floating]) -> NDArray[np.float64]:
    """Return ``-sum_c p_c log p_c`` per row (``0 log 0 = 0``)."""
    p = _probs(probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    return np.asarray(-terms.sum(axis=1))


def margin(probs: NDArray[np.floating]) -> NDArray[np.float64]:
    """Return the gap between the two largest probabilities per row."""
    p = np.sort(_probs(probs), axis=1)
    return np.asarray(p[:, -1] - p[:, -2])


def least_confidence(probs: NDArray[np.floating]) -> NDArray[np.float64]:
    """Return ``1 - max_c p_c`` per row (larger is less confident)."""
    return np.asarray(1.0 - _probs(probs).max(axis=1))


def top_k(scores: NDArray[np.floating], k: int, largest: bool = True) -> NDArray[np.int64]:
    """Return the indices of the ``k`` largest (or smallest) scores, ties to the lower index."""
    s = np.asarray(scores, dtype=np.float64)
    k = _count("k", k)
    if s.ndim != 1 or k > s.size:
        raise ConfigurationError(f"need a 1-D score array of at least k = {k} entries")
    order = np.argsort(-s if largest else s, kind="stable")
    return np.asarray(order[:k], dtype=np.int64)


def _distances(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """Euclidean distances ``(len(a), len(b))`` by ``|a|^2 + |b|^2 - 2 a.b`` (one matmul)."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    return np.asarray(np.sqrt(np.maximum(d2, 0.0)))


def greedy_k_center(
    features: NDArray[np.floating],
    k: int,
    existing: NDArray[np.floating] | None = None,
    seed: int = 0,
) -> NDArray[np.int64]:
    """Greedy k-center (Sener & Savarese 2018): ``k`` pool points, each farthest from the centers.

    Parameters
    ----------
    features : numpy.ndarray
        Pool points ``(P, d)``.
    k : int
        How many to choose, ``0 <= k <= P``.
    existing : numpy.ndarray, optional
        Centers already held ``(E, d)`` (``s^0``, e.g. the querier's training data). Without
        them the first point is drawn uniformly with ``seed``.
    seed : int
        Seed of the first point when ``existing`` is empty.

    Returns
    -------
    numpy.ndarray
        The chosen pool indices in the order chosen (distinct while some point is uncovered;
        once every point is at distance 0 the lowest remaining indices fill the rest).
    """
    f = _features(features)
    k = _count("k", k)
    if k > len(f):
        raise ConfigurationError(f"k = {k} exceeds the pool size {len(f)}")
    nearest = np.full(len(f), np.inf)
    if existing is not None:
        e = _features(existing, "existing")
        if e.shape[1] != f.shape[1]:
            raise ConfigurationError("existing must have the pool's feature dimension")
        for start in range(0, len(e), 1024):
            nearest = np.minimum(nearest, _distances(f, e[start : start + 1024]).min(axis=1))
    chosen: list[int] = []
    taken = np.zeros(len(f), dtype=bool)
    for step in range(k):
        if step == 0 and not np.isfinite(nearest).any():
            pick = int(np.random.default_rng(seed).integers(0, len(f)))
        else:
            score = np.where(taken, -1.0, nearest)
            pick = int(np.argmax(score))  # first maximum: the lower index on ties
        chosen.append(pick)
        taken[pick] = True
        nearest = np.minimum(nearest, np.sqrt(((f - f[pick]) ** 2).sum(axis=1)))
    return np.asarray(chosen, dtype=np.int64)


def kmeans(
    features: NDArray[np.floating], clusters: int, seed: int = 0, iterations: int = 50
) -> NDArray[np.int64]:
    """Cluster ``features`` with k-means (k-means++ seeding, Lloyd iterations); return labels.

    Parameters
    ----------
    features : numpy.ndarray
        Points ``(P, d)``.
    clusters : int
        Number of clusters, ``1 <= clusters <= P``.
    seed : int
        Seed of the k-means++ seeding.
    iterations : int
        Most Lloyd iterations (stops early when the assignment is stable).

    Returns
    -------
    numpy.ndarray
        int64 ``(P,)`` cluster labels in ``[0, clusters)`` (a cluster may end up empty).
    """
    f = _features(features)
    clusters = _count("clusters", clusters, 1)
    if clusters > len(f):
        raise ConfigurationError(f"clusters = {clusters} exceeds the number of points {len(f)}")
    rng = np.random.default_rng(seed)
    centers = [f[int(rng.integers(0, len(f)))]]
    d2 = ((f - centers[0]) ** 2).sum(1)
    for _ in range(1, clusters):
        total = float(d2.sum())
        pick = int(rng.choice(len(f), p=d2 / total)) if total > 0 else int(rng.integers(len(f)))
        centers.append(f[pick])
        d2 = np.minimum(d2, ((f - f[pick]) ** 2).sum(1))
    c = np.stack(centers)
    labels = np.full(len(f), -1, dtype=np.int64)
    for _ in range(_count("iterations", iterations, 1)):
        new = np.argmin(_distances(f, c), axis=1).astype(np.int64)
        if np.array_equal(new, labels):
            break
        labels = new
        for q in range(clusters):
            members = f[labels == q]
            if len(members):
                c[q] = members.mean(axis=0)
    return labels


def _proportional(sizes: NDArray[np.int64], k: int) -> NDArray[np.int64]:
    """Split ``k <= sum(sizes)`` over groups in proportion to ``sizes`` (largest remainder).

    Each group gets ``floor(q)`` of its quota ``q = size * k / total`` and the ``k - sum floor``
    groups with the largest fractional parts (ties to the lower group) one more. A group with
    a fractional part has ``q < size``, so the extra one never exceeds its size.
    """
    quota = sizes * (k / int(sizes.sum()))
    alloc = np.floor(quota).astype(np.int64)
    extra = k - int(alloc.sum())
    order = np.argsort(-(quota - alloc), kind="stable")
    alloc[order[:extra]] += 1
    return alloc


def icd(
    probs: NDArray[np.floating],
    features: NDArray[np.floating],
    k: int,
    clusters: int = 10,
    seed: int = 0,
) -> NDArray[np.int64]:
    """Informative-and-diverse selection: lowest margins per k-means cluster, in proportion.

    Parameters
    ----------
    probs : numpy.ndarray
        The querier's class probabilities on the pool ``(P, C)``.
    features : numpy.ndarray
        Its features on the pool ``(P, d)``.
    k : int
        How many to choose.
    clusters : int
        Number of k-means clusters (at most ``P``).
    seed : int
        Seed of the clustering.

    Returns
    -------
    numpy.ndarray
        The chosen pool indices, cluster by cluster.
    """
    gap = margin(probs)
    f = _features(features)
    k = _count("k", k)
    if len(f) != len(gap) or k > len(gap):
        raise ConfigurationError("probs and features must describe one pool of at least k points")
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    labels = kmeans(f, min(clusters, len(f)), seed)
    groups = np.unique(labels)
    sizes = np.array([int((labels == g).sum()) for g in groups], dtype=np.int64)
    alloc = _proportional(sizes, k)
    chosen = []
    for g, take in zip(groups, alloc, strict=True):
        members = np.flatnonzero(labels == g)
        chosen.append(members[top_k(gap[members], int(take), largest=False)])
    return np.concatenate(chosen).astype(np.int64)


def select(
    strategy: Strategy | str,
    k: int,
    pool_size: int,
    *,
    probs: NDArray[np.floating] | None = None,
    features: NDArray[np.floating] | None = None,
    existing: NDArray[np.floating] | None = None,
    seed: int = 0,
    clusters: int = 10,
) -> NDArray[np.int64]:
    """Choose ``k`` of ``pool_size`` pool samples by ``strategy`` (module docstring).

    Parameters
    ----------
    strategy : str
        One of :data:`STRATEGIES`.
    k : int
        How many, ``0 <= k <= pool_size``.
    pool_size : int
        The pool's size (``probs`` / ``features`` must have that many rows).
    probs : numpy.ndarray, optional
        Class probabilities of the querier's model on the pool (entropy, margin,
        least_confidence, icd).
    features : numpy.ndarray, optional
        Its feature vectors on the pool (kcenter, icd).
    existing : numpy.ndarray, optional
        Features of the centers already held (kcenter's ``s^0``).
    seed : int
        Seed of random sampling, k-center's first point and icd's clustering.
    clusters : int
        icd's number of clusters.

    Returns
    -------
    numpy.ndarray
        int64 pool indices, distinct, ``k`` of them.

    Raises
    ------
    ConfigurationError
        If the strategy is unknown, ``k`` is out of range or an input it needs is missing or
        malformed.
    """
    pool_size = _count("pool_size", pool_size)
    k = _count("k", k)
    if k > pool_size:
        raise ConfigurationError(f"k = {k} exceeds the pool size {pool_size}")
    if strategy not in STRATEGIES:
        raise ConfigurationError(
            f"unknown selection strategy {strategy!r}; choose one of {STRATEGIES}"
        )
    for name, given in (("probs", probs), ("features", features)):
        if given is not None and len(np.asarray(given)) != pool_size:
            raise ConfigurationError(f"{name} must have one row per pool sample ({pool_size})")
    if strategy == "random":
        rng = np.random.default_rng(seed)
        return np.sort(rng.choice(pool_size, size=k, replace=False)).astype(np.int64)
    if strategy == "entropy":
        return top_k(entropy(_probs(probs)), k, largest=True)
    if strategy == "margin":
        return top_k(margin(_probs(probs)), k, largest=False)
    if strategy == "least_confidence":
        return top_k(least_confidence(_probs(probs)), k, largest=True)
    if strategy == "kcenter":
        return greedy_k_center(_features(features), k, existing, seed)
    return icd(_probs(probs), _features(features), k, clusters, seed)
