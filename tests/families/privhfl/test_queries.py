"""PrivHFL query-set expansion (mixup, cutmix, cutout) and selection (random, active learning)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.privhfl.queries import (
    CUTOUT_RATIO,
    CUTOUT_SCALE,
    EXPANSIONS,
    MIXUP_LAMBDAS,
    STRATEGIES,
    _proportional,
    cutmix_pool,
    cutout_pool,
    entropy,
    expand,
    greedy_k_center,
    icd,
    kmeans,
    least_confidence,
    margin,
    mixup,
    mixup_pool,
    private_pool,
    select,
    softmax,
    top_k,
)


def _images(n: int = 12, shape: tuple[int, ...] = (28, 28), seed: int = 0) -> np.ndarray:
    # Distinct positive pixels everywhere, so every output pixel names its source image.
    rng = np.random.default_rng(seed)
    return (rng.random((n, *shape)) * 0.9 + 0.1).astype(np.float32)


def _probs(n: int, c: int = 4, seed: int = 0) -> np.ndarray:
    return softmax(np.random.default_rng(seed).normal(size=(n, c)) * 2)


# -- expansion ------------------------------------------------------------------------------------
def test_lambda_set_is_point_one_to_point_nine() -> None:
    assert MIXUP_LAMBDAS == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def test_mixup_pool_formula_pairs_and_lambdas() -> None:
    x = _images(10, (1, 28, 28))
    pool = mixup_pool(x, 90, seed=3)
    assert pool.images.shape == (90, 1, 28, 28) and pool.images.dtype == np.float32
    assert len(pool) == 90 and pool.method == "mixup"
    assert np.all(pool.first != pool.second)
    expected = (
        pool.lam[:, None, None, None] * x[pool.first]
        + (1 - pool.lam)[:, None, None, None] * x[pool.second]
    )
    np.testing.assert_allclose(pool.images, expected, rtol=1e-6, atol=1e-7)
    # every pair carries the whole lambda set
    per_pair: dict[tuple[int, int], list[float]] = {}
    for i, j, lam in zip(pool.first, pool.second, pool.lam, strict=True):
        per_pair.setdefault((int(i), int(j)), []).append(float(lam))
    assert len(per_pair) <= 10
    for lams in per_pair.values():
        assert len(lams) % 9 == 0 and sorted(set(lams)) == list(MIXUP_LAMBDAS)
    assert not np.any(pool.boxes)


def test_mixup_pool_is_seeded_and_shuffled() -> None:
    x = _images(6)
    a, b, c = mixup_pool(x, 40, seed=1), mixup_pool(x, 40, seed=1), mixup_pool(x, 40, seed=2)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.lam, b.lam)
    assert not np.array_equal(a.images, c.images)
    assert len(set(np.round(a.lam[:9], 1))) > 1  # not pair-by-pair in lambda order
    partial = mixup_pool(x, 13, seed=0)
    assert len(partial) == 13


@given(
    lam=st.sampled_from(MIXUP_LAMBDAS),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_mixup_is_the_convex_combination(lam: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.random((3, 5, 5), dtype=np.float32), rng.random((3, 5, 5), dtype=np.float32)
    out = mixup(a, b, lam)
    np.testing.assert_allclose(out, lam * a + (1 - lam) * b, rtol=1e-6)
    assert np.all(out >= np.minimum(a, b) - 1e-6) and np.all(out <= np.maximum(a, b) + 1e-6)
    per_image = mixup(a, b, np.array([lam, 1.0, 0.0]))
    np.testing.assert_allclose(per_image[1], a[1])
    np.testing.assert_allclose(per_image[2], b[2])


def test_mixed_labels_math() -> None:
    x = _images(8)
    y = np.array([0, 1, 2, 0, 1, 2, 3, 3])
    pool = mixup_pool(x, 72, seed=0)
    labels = pool.mixed_labels(y, 4)
    assert labels.shape == (72, 4)
    np.testing.assert_allclose(labels.sum(1), 1.0)
    for n in range(len(pool)):
        expected = np.zeros(4)
        expected[y[pool.first[n]]] += pool.lam[n]
        expected[y[pool.second[n]]] += 1 - pool.lam[n]
        np.testing.assert_allclose(labels[n], expected)
        if y[pool.first[n]] == y[pool.second[n]]:
            assert labels[n].max() == pytest.approx(1.0)
    with pytest.raises(ConfigurationError):
        pool.mixed_labels(y[:3], 4)
    with pytest.raises(ConfigurationError):
        pool.mixed_labels(y, 3)
    with pytest.raises(ConfigurationError):
        pool.mixed_labels(y.astype(float), 4)  # type: ignore[arg-type]


def test_cutmix_box_area_matches_lambda() -> None:
    x = _images(9, (1, 28, 28))
    pool = cutmix_pool(x, 300, seed=4)
    assert pool.images.shape == (300, 1, 28, 28)
    bound = 2 * 28 * 0.5 / 28**2 + 1 / 28**2  # rounding each side by <= 1/2 pixel
    targets = set()
    for n in range(len(pool)):
        top, left, h, w = (int(v) for v in pool.boxes[n])
        assert 0 <= top and top + h <= 28 and 0 <= left and left + w <= 28  # fully inside
        img, xi, xj = pool.images[n, 0], x[pool.first[n], 0], x[pool.second[n], 0]
        inside = np.zeros((28, 28), bool)
        inside[top : top + h, left : left + w] = True
        assert np.array_equal(img[inside], xj[inside])
        assert np.array_equal(img[~inside], xi[~inside])
        # lam is exactly the fraction of pixels from x_i ...
        assert pool.lam[n] == pytest.approx(float((img == xi).mean()))
        # ... and within rounding of one of the target lambdas
        target = min(MIXUP_LAMBDAS, key=lambda t: abs(t - pool.lam[n]))
        assert abs(pool.lam[n] - target) <= bound + 1e-12
        assert h == w  # square images: the box keeps the aspect ratio
        targets.add(target)
    assert targets == set(MIXUP_LAMBDAS)
    labels = pool.mixed_labels(np.arange(9), 9)
    np.testing.assert_allclose(labels[np.arange(300), pool.first], pool.lam)


def test_cutout_matches_random_erasing() -> None:
    x = _images(7, (1, 28, 28))
    pool = cutout_pool(x, 400, seed=5)
    assert np.array_equal(pool.first, pool.second) and np.all(pool.lam == 1.0)
    lo, hi = CUTOUT_SCALE
    r_lo, r_hi = CUTOUT_RATIO
    for n in range(len(pool)):
        top, left, h, w = (int(v) for v in pool.boxes[n])
        assert 0 < h < 28 and 0 < w < 28 and top + h <= 28 and left + w <= 28
        img, src = pool.images[n, 0], x[pool.first[n], 0]
        erased = np.zeros((28, 28), bool)
        erased[top : top + h, left : left + w] = True
        assert np.all(img[erased] == 0.0)
        assert np.array_equal(img[~erased], src[~erased])
        # h, w are rounded from sqrt(area * r), sqrt(area / r): check the pre-rounding ranges
        area = 28 * 28
        assert (h - 0.5) * (w - 0.5) <= hi * area and (h + 0.5) * (w + 0.5) >= lo * area
        assert (h - 0.5) / (w + 0.5) <= r_hi and (h + 0.5) / (w - 0.5) >= r_lo
    fractions = pool.boxes[:, 2] * pool.boxes[:, 3] / 784
    assert fractions.min() < 0.06 and fractions.max() > 0.25  # the whole scale range is used


def test_cutout_gives_up_as_random_erasing_does() -> None:
    # 3x3 images with 90-100% of the area to erase: h < 3 and w < 3 never fits (h*w >= 8.1).
    x = _images(2, (3, 3))
    pool = cutout_pool(x, 20, seed=0, scale=(0.9, 1.0), ratio=(1.0, 1.0))
    assert not np.any(pool.boxes)
    assert np.array_equal(pool.images, x[pool.first])


def test_private_pool_and_expand() -> None:
    x = _images(5)
    pool = private_pool(x)
    assert np.array_equal(pool.images, x) and np.array_equal(pool.first, np.arange(5))
    assert np.array_equal(pool.mixed_labels(np.arange(5), 5), np.eye(5))
    for method in EXPANSIONS:
        p = expand(x, method, 20, seed=1)
        assert p.method == method
        assert len(p) == (5 if method == "private" else 20)
        q = expand(x, method, 20, seed=1)
        assert np.array_equal(p.images, q.images)
    with pytest.raises(ConfigurationError, match="unknown expansion"):
        expand(x, "gaussian", 10)
    with pytest.raises(ConfigurationError, match="pool size"):
        expand(x, "mixup")


def test_take() -> None:
    pool = mixup_pool(_images(4), 20, seed=0)
    sub = pool.take(np.array([3, 0, 3]))
    assert np.array_equal(sub.images[0], pool.images[3]) and sub.lam[1] == pool.lam[0]
    with pytest.raises(ConfigurationError):
        pool.take(np.array([20]))
    with pytest.raises(ConfigurationError):
        pool.take(np.array([[0]]))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: mixup_pool(_images(1), 5), "two private"),
        (lambda: mixup_pool(np.zeros((3, 4)), 5), "images"),
        (lambda: mixup_pool(np.zeros((0, 4, 4)), 5), "at least one"),
        (lambda: mixup_pool(np.full((3, 4, 4), np.nan), 5), "finite"),
        (lambda: mixup_pool(np.zeros((3, 4, 4), np.int64), 5), "floating"),  # type: ignore[arg-type]
        (lambda: mixup_pool(_images(3), -1), "size"),
        (lambda: mixup_pool(_images(3), True), "size"),  # type: ignore[arg-type]
        (lambda: mixup_pool(_images(3), 5, lambdas=(0.0, 0.5)), "lambdas"),
        (lambda: mixup_pool(_images(3), 5, lambdas=()), "lambdas"),
        (lambda: cutmix_pool(_images(3), 5, lambdas=(1.2,)), "lambdas"),
        (lambda: cutout_pool(_images(3), 5, scale=(0.5, 0.2)), "scale"),
        (lambda: cutout_pool(_images(3), 5, ratio=(0.0, 1.0)), "ratio"),
        (lambda: cutout_pool(_images(3), 5, value=math.inf), "value"),
        (lambda: mixup(np.zeros((2, 3)), np.zeros((3, 3)), 0.5), "shape"),
    ],
)
def test_expansion_validates(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=match):
        call()


# -- scores ---------------------------------------------------------------------------------------
def test_scores_by_hand() -> None:
    p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.6, 0.3, 0.1]])
    np.testing.assert_allclose(entropy(p), [0.0, math.log(2), math.log(3), 0.8979457], atol=1e-7)
    np.testing.assert_allclose(margin(p), [1.0, 0.0, 0.0, 0.3])
    np.testing.assert_allclose(least_confidence(p), [0.0, 0.5, 2 / 3, 0.4])
    np.testing.assert_allclose(softmax(np.log(p[3:]) + 7.0), p[3:])
    np.testing.assert_allclose(softmax(np.array([[1000.0, 0.0]])), [[1.0, 0.0]])
    np.testing.assert_allclose(softmax(np.array([[2.0, 0.0]]), temperature=2.0)[0, 0],
                               math.e / (math.e + 1))  # fmt: skip
    for bad in (np.array([[0.5, 0.6]]), np.array([[1.0, -0.0001, 0.0001]]), np.ones(3) / 3):
        with pytest.raises(ConfigurationError):
            entropy(bad)
    with pytest.raises(ConfigurationError):
        softmax(np.array([[np.inf, 0.0]]))
    with pytest.raises(ConfigurationError):
        softmax(np.zeros((1, 2)), temperature=0.0)


def test_top_k_ties_to_the_lower_index() -> None:
    s = np.array([1.0, 3.0, 3.0, 2.0, 3.0])
    assert top_k(s, 2).tolist() == [1, 2]
    assert top_k(s, 2, largest=False).tolist() == [0, 3]
    assert top_k(s, 0).size == 0
    with pytest.raises(ConfigurationError):
        top_k(s, 6)


# -- selection ------------------------------------------------------------------------------------
@given(n=st.integers(1, 40), k_frac=st.floats(0, 1), seed=st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_uncertainty_selection_equals_brute_force(n: int, k_frac: float, seed: int) -> None:
    probs = _probs(n, 5, seed)
    k = round(k_frac * n)
    ent, gap, conf = entropy(probs), margin(probs), least_confidence(probs)
    for strategy, scores, largest in (
        ("entropy", ent, True),
        ("margin", gap, False),
        ("least_confidence", conf, True),
    ):
        chosen = select(strategy, k, n, probs=probs)
        assert len(chosen) == k and len(set(chosen.tolist())) == k
        # brute force: no unchosen sample scores strictly better than a chosen one
        rest = np.setdiff1d(np.arange(n), chosen)
        if k and rest.size:
            worst = scores[chosen].min() if largest else scores[chosen].max()
            best_rest = scores[rest].max() if largest else scores[rest].min()
            assert (best_rest <= worst) if largest else (best_rest >= worst)
        sign = -1.0 if largest else 1.0
        brute = sorted(range(n), key=lambda i, s=scores, g=sign: (g * s[i], i))
        assert chosen.tolist() == brute[:k]


def test_entropy_picks_the_uniform_rows() -> None:
    confident = np.tile([0.97, 0.01, 0.01, 0.01], (20, 1))
    probs = confident.copy()
    probs[[4, 11, 17]] = 0.25
    assert sorted(select("entropy", 3, 20, probs=probs).tolist()) == [4, 11, 17]
    assert sorted(select("margin", 3, 20, probs=probs).tolist()) == [4, 11, 17]


def test_random_selection() -> None:
    a = select("random", 30, 100, seed=3)
    assert len(set(a.tolist())) == 30 and a.min() >= 0 and a.max() < 100
    assert np.array_equal(a, select("random", 30, 100, seed=3))
    assert not np.array_equal(a, select("random", 30, 100, seed=4))
    assert select("random", 100, 100).tolist() == list(range(100))


def _radius(points: np.ndarray, centers: np.ndarray) -> float:
    d = np.sqrt(((points[:, None, :] - centers[None, :, :]) ** 2).sum(-1))
    return float(d.min(axis=1).max())


@given(n=st.integers(2, 9), k=st.integers(1, 4), seed=st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_k_center_is_greedy_and_a_two_approximation(n: int, k: int, seed: int) -> None:
    k = min(k, n)
    f = np.random.default_rng(seed).normal(size=(n, 3))
    chosen = greedy_k_center(f, k, seed=seed)
    assert len(set(chosen.tolist())) == k
    # each step takes the farthest point from the centers so far (brute force)
    for step in range(1, k):
        d = np.sqrt(((f[:, None, :] - f[chosen[:step]][None, :, :]) ** 2).sum(-1)).min(1)
        assert d[chosen[step]] == pytest.approx(d.max())
    # covering radius within twice the optimum over all k-subsets (Gonzalez)
    opt = min(_radius(f, f[list(c)]) for c in itertools.combinations(range(n), k))
    assert _radius(f, f[chosen]) <= 2 * opt + 1e-9


def test_k_center_with_existing_centers() -> None:
    rng = np.random.default_rng(0)
    existing = rng.normal(size=(5, 2))
    pool = np.concatenate([existing + 1e-3, [[50.0, 50.0], [-40.0, 10.0]]])
    chosen = select("kcenter", 2, len(pool), features=pool, existing=existing)
    assert sorted(chosen.tolist()) == [5, 6]  # the far points, not those next to s^0
    assert chosen[0] == 5  # the farthest first
    with pytest.raises(ConfigurationError, match="dimension"):
        greedy_k_center(pool, 1, existing=np.zeros((2, 3)))
    # all points covered: still k distinct indices
    dup = np.zeros((4, 2))
    assert sorted(greedy_k_center(dup, 4).tolist()) == [0, 1, 2, 3]


def test_kmeans_finds_separated_clusters() -> None:
    rng = np.random.default_rng(1)
    centers = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    truth = np.repeat(np.arange(3), [30, 20, 10])
    f = centers[truth] + rng.normal(size=(60, 2))
    labels = kmeans(f, 3, seed=0)
    # the same partition up to renaming
    for a, b in itertools.combinations(range(60), 2):
        assert (labels[a] == labels[b]) == (truth[a] == truth[b])


def test_icd_keeps_the_cluster_distribution_and_takes_low_margins() -> None:
    rng = np.random.default_rng(2)
    centers = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    truth = np.repeat(np.arange(3), [50, 30, 20])
    f = centers[truth] + rng.normal(size=(100, 2))
    probs = _probs(100, 3, seed=3)
    chosen = icd(probs, f, 10, clusters=3, seed=0)
    assert len(set(chosen.tolist())) == 10
    assert np.bincount(truth[chosen], minlength=3).tolist() == [5, 3, 2]
    gap = margin(probs)
    for c in range(3):
        members = np.flatnonzero(truth == c)
        mine = chosen[truth[chosen] == c]
        assert sorted(mine.tolist()) == sorted(members[np.argsort(gap[members])][: len(mine)])
    via_select = select("icd", 10, 100, probs=probs, features=f, clusters=3)
    assert np.array_equal(np.sort(via_select), np.sort(chosen))


@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    frac=st.floats(0, 1),
)
@settings(max_examples=80, deadline=None)
def test_proportional_allocation(sizes: list[int], frac: float) -> None:
    s = np.array(sizes, dtype=np.int64)
    k = round(frac * s.sum())
    alloc = _proportional(s, k)
    assert alloc.sum() == k and np.all(alloc <= s) and np.all(alloc >= 0)
    quota = s * k / s.sum()
    assert np.all(np.abs(alloc - quota) < 1 + 1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "bald", "k": 1, "pool_size": 3}, "unknown selection"),
        ({"strategy": "random", "k": 4, "pool_size": 3}, "exceeds"),
        ({"strategy": "random", "k": -1, "pool_size": 3}, "k must"),
        ({"strategy": "entropy", "k": 1, "pool_size": 3}, "probs"),
        ({"strategy": "margin", "k": 1, "pool_size": 3, "probs": np.ones((2, 2)) / 2}, "one row"),
        ({"strategy": "kcenter", "k": 1, "pool_size": 3}, "features"),
        ({"strategy": "icd", "k": 1, "pool_size": 3, "probs": np.ones((3, 2)) / 2}, "features"),
        (
            {"strategy": "kcenter", "k": 1, "pool_size": 2, "features": np.array([[0], [np.nan]])},
            "finite",
        ),
    ],
)
def test_select_validates(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigurationError, match=match):
        select(**kwargs)


def test_every_strategy_runs_on_a_pool() -> None:
    pool = mixup_pool(_images(10, (4, 4)), 60, seed=0)
    probs = _probs(60, 4, seed=1)
    feats = pool.images.reshape(60, -1)
    for strategy in STRATEGIES:
        chosen = select(strategy, 15, len(pool), probs=probs, features=feats, seed=2, clusters=4)
        assert len(set(chosen.tolist())) == 15
        assert len(pool.take(chosen)) == 15
