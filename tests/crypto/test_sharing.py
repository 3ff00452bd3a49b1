"""Sharing: additive and Shamir reconstruction, Shamir privacy, Lagrange, Beaver, truncation."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.ring import Z2_64, PrimeField, Ring, Z2k
from flwr_fsl.crypto.sharing import (
    Dealer,
    NotEnoughSharesError,
    PartyRandomness,
    Shamir,
    ShareError,
    TripleShape,
    additive_reconstruct,
    additive_share,
    beaver_mask,
    beaver_matmul,
    beaver_mul,
    interpolate,
    lagrange_matrix,
    truncate_finish,
    truncate_local,
    truncate_mask,
)

U64 = np.uint64
F = PrimeField()
RINGS: list[Ring] = [Z2_64, Z2k(16), F, PrimeField(11)]


def _ids(r: object) -> str:
    return str(r)


def _prg(seed: int) -> PRGStream:
    return PRGStream(seed.to_bytes(16, "little"))


def _random(ring: Ring, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return ring.random(shape, _prg(seed))


def _signed(ring: Z2k, words: np.ndarray) -> np.ndarray:
    return ring.decode_signed(words)


# ---------------------------------------------------------------------------------- additive


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@pytest.mark.parametrize("n", [2, 3, 100])
@given(shape=st.sampled_from([(), (1,), (7,), (3, 4)]), seed=st.integers(0, 2**32 - 1))
def test_additive_reconstruction(ring: Ring, n: int, shape: tuple[int, ...], seed: int) -> None:
    secret = _random(ring, shape, seed)
    shares = additive_share(ring, secret, n, _prg(seed + 1))
    assert shares.shape == (n, *shape) and shares.dtype == U64
    np.testing.assert_array_equal(additive_reconstruct(ring, shares), secret)
    np.testing.assert_array_equal(additive_reconstruct(ring, list(shares)), secret)
    # Any n - 1 shares miss the secret: dropping one changes the sum (almost surely).
    if ring.modulus > 2**10 and shape == (7,):
        assert not np.array_equal(additive_reconstruct(ring, shares[1:]), secret)


def test_additive_first_shares_do_not_depend_on_the_secret() -> None:
    # The first n - 1 shares are the PRG's draws alone: same stream, different secrets, same
    # shares; only the last share absorbs the secret.
    ring = F
    a = additive_share(ring, ring.element([1, 2, 3]), 4, _prg(9))
    b = additive_share(ring, ring.element([7, 7, 7]), 4, _prg(9))
    np.testing.assert_array_equal(a[:3], b[:3])
    assert not np.array_equal(a[3], b[3])


@pytest.mark.parametrize("ring", [Z2_64, F], ids=_ids)
def test_additive_errors(ring: Ring) -> None:
    ok = ring.zeros(3)
    with pytest.raises(ConfigurationError, match="n_parties"):
        additive_share(ring, ok, 1, _prg(0))
    with pytest.raises(ConfigurationError, match="n_parties"):
        additive_share(ring, ok, True, _prg(0))  # type: ignore[arg-type]
    with pytest.raises(ShareError, match="shape"):
        additive_reconstruct(ring, [ok, ring.zeros(4)])
    with pytest.raises(ShareError, match="uint64"):
        additive_reconstruct(ring, [ok, ok.astype(np.int64)])
    with pytest.raises(ShareError, match="leading party axis"):
        additive_reconstruct(ring, np.asarray(U64(3)))
    with pytest.raises(NotEnoughSharesError):
        additive_reconstruct(ring, [])
    if isinstance(ring, PrimeField):
        with pytest.raises(ShareError, match="not an element"):
            additive_reconstruct(ring, [ok, np.full(3, ring.p, dtype=U64)])
    assert issubclass(ShareError, ClientInputError)
    assert issubclass(NotEnoughSharesError, RoundFailedError)


# ---------------------------------------------------------------------------------- Shamir


@pytest.mark.parametrize("n, t", [(2, 1), (3, 1), (3, 2), (100, 49), (100, 99)])
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_shamir_reconstruction(n: int, t: int, seed: int, data: st.DataObject) -> None:
    scheme = Shamir.for_parties(F, t, n)
    secrets = _random(F, (3, 4), seed)
    shares = scheme.share(secrets, _prg(seed + 1))
    assert shares.shape == (n, 3, 4)
    size = data.draw(st.integers(t + 1, n))
    parties = data.draw(st.permutations(range(n)))[:size]
    got = scheme.reconstruct(parties, shares[parties])
    np.testing.assert_array_equal(got, secrets)


def test_shamir_from_every_t_plus_1_subset() -> None:
    scheme = Shamir.for_parties(F, 2, 5)
    secrets = F.element([0, 1, F.p - 1, 12345])
    shares = scheme.share(secrets, _prg(3))
    for size in (3, 4, 5):
        for subset in itertools.combinations(range(5), size):
            got = scheme.reconstruct(list(subset), [shares[i] for i in subset])
            np.testing.assert_array_equal(got, secrets)


def test_shamir_custom_points_and_scalar_secret() -> None:
    scheme = Shamir(F, 1, (5, F.p - 1, 77))
    shares = scheme.share(F.element(424242), _prg(4))
    assert shares.shape == (3,)
    assert int(scheme.reconstruct([2, 0], shares[[2, 0]])) == 424242


def _enumerate_views(scheme: Shamir, secret: int, viewers: tuple[int, ...]) -> Counter:
    """Joint distribution of the viewers' shares over *every* coefficient vector (p = 11)."""

    class Coefficients:
        """A word source whose first 32-bit candidates are exactly the given coefficients."""

        def __init__(self, coeffs: tuple[int, ...]) -> None:
            halves = [*coeffs, 0] if len(coeffs) % 2 else list(coeffs)
            self._first = [halves[i] | (halves[i + 1] << 32) for i in range(0, len(halves), 2)]

        def words(self, n_words: int) -> np.ndarray:
            out = (self._first + [0] * n_words)[:n_words]
            self._first = []
            return np.array(out, dtype=U64)

    p = scheme.field.p
    views: Counter = Counter()
    for coeffs in itertools.product(range(p), repeat=scheme.threshold):
        shares = scheme.share(scheme.field.element([secret]), Coefficients(coeffs))
        views[tuple(int(shares[i, 0]) for i in viewers)] += 1
    return views


def test_shamir_t_shares_are_independent_of_the_secret_exactly() -> None:
    # F_11, t = 2, n = 4: for every secret and every pair of parties, enumerating all 121
    # coefficient vectors gives each of the 121 possible share pairs exactly once.
    f = PrimeField(11)
    scheme = Shamir.for_parties(f, 2, 4)
    for viewers in itertools.combinations(range(4), 2):
        for secret in range(11):
            views = _enumerate_views(scheme, secret, viewers)
            assert len(views) == 121 and set(views.values()) == {1}, (viewers, secret)


def test_the_enumeration_detects_a_leak() -> None:
    # The same check on t + 1 = 3 shares (or on a degree-1 scheme viewed by 2 parties) must
    # fail: the view determines the secret, so its support moves with the secret.
    f = PrimeField(11)
    scheme = Shamir.for_parties(f, 2, 4)
    assert set(_enumerate_views(scheme, 0, (0, 1, 2))) != set(
        _enumerate_views(scheme, 1, (0, 1, 2))
    )
    weak = Shamir.for_parties(f, 1, 4)
    assert set(_enumerate_views(weak, 0, (0, 1))) != set(_enumerate_views(weak, 1, (0, 1)))


def test_shamir_reconstruct_errors() -> None:
    scheme = Shamir.for_parties(F, 2, 5)
    shares = scheme.share(F.element([1, 2]), _prg(5))
    with pytest.raises(NotEnoughSharesError, match="t \\+ 1 = 3"):
        scheme.reconstruct([0, 1], shares[:2])
    with pytest.raises(ShareError, match="repeat"):
        scheme.reconstruct([0, 1, 1], shares[[0, 1, 1]])
    with pytest.raises(ShareError, match="party index"):
        scheme.reconstruct([0, 1, 5], shares[:3])
    with pytest.raises(ShareError, match="party index"):
        scheme.reconstruct([0, 1, True], shares[:3])
    with pytest.raises(ShareError, match="3 shares for 4"):
        scheme.reconstruct([0, 1, 2, 3], shares[:3])
    with pytest.raises(ShareError, match="uint64"):
        scheme.reconstruct([0, 1, 2], [shares[0], shares[1], shares[2].astype(np.int64)])
    with pytest.raises(ShareError, match="not an element"):
        bad = shares[:3].copy()
        bad[2, 0] = F.p
        scheme.reconstruct([0, 1, 2], bad)
    # A tampered extra share is caught; without the check the first t + 1 decide.
    tampered = shares.copy()
    tampered[4, 1] = F.add(tampered[4, 1], U64(1))
    with pytest.raises(ShareError, match="inconsistent"):
        scheme.reconstruct(range(5), tampered)
    np.testing.assert_array_equal(
        scheme.reconstruct(range(5), tampered, check=False), F.element([1, 2])
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"threshold": 0, "points": (1, 2)}, "threshold"),
        ({"threshold": 2, "points": (1, 2)}, "threshold"),
        ({"threshold": True, "points": (1, 2, 3)}, "threshold"),
        ({"threshold": 1, "points": (0, 2)}, "nonzero"),
        ({"threshold": 1, "points": (1, F.p)}, "nonzero"),
        ({"threshold": 1, "points": (3, 3)}, "distinct"),
        ({"threshold": 1, "points": (1, 2.0)}, "integers"),
    ],
)
def test_shamir_configuration_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Shamir(F, **kwargs)


def test_shamir_needs_a_field_and_two_parties() -> None:
    with pytest.raises(ConfigurationError, match="PrimeField"):
        Shamir(Z2_64, 1, (1, 2))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="n_parties"):
        Shamir.for_parties(F, 1, 1)


# ---------------------------------------------------------------------------------- Lagrange


@given(k=st.integers(1, 12), seed=st.integers(0, 2**32 - 1), n_at=st.integers(0, 10))
def test_interpolate_recovers_a_random_polynomial(k: int, seed: int, n_at: int) -> None:
    # f of degree < k with vector coefficients, values at k distinct nodes -> f at new points.
    rng = np.random.default_rng(seed)
    coeffs = [[int(v) for v in rng.integers(0, F.p, 3)] for _ in range(k)]
    nodes = [int(v) for v in rng.choice(2**31, size=k, replace=False)]
    at = [int(v) for v in rng.integers(0, F.p, n_at)]

    def horner(z: int) -> list[int]:
        acc = [0, 0, 0]
        for c in reversed(coeffs):
            acc = [(a * z + ci) % F.p for a, ci in zip(acc, c, strict=True)]
        return acc

    ys = np.array([horner(z) for z in nodes], dtype=U64)
    got = interpolate(F, nodes, ys, at)
    assert got.shape == (n_at, 3)
    assert got.tolist() == [horner(z) for z in at]
    # The matrix is reusable: one matmul per value vector.
    matrix = lagrange_matrix(F, nodes, at)
    np.testing.assert_array_equal(F.matmul(matrix, ys), got)


def test_sesa_style_encode_then_decode() -> None:
    # Encode K data values and T random masks as u(beta_j), hand u(alpha_i) to N parties,
    # decode from any K + T of them: the data come back at the betas.
    k_, t_, n_ = 3, 2, 8
    betas = list(range(1, k_ + t_ + 1))
    alphas = list(range(100, 100 + n_))
    data = _random(F, (k_, 6), 1)
    masks = _random(F, (t_, 6), 2)
    coded = interpolate(F, betas, np.concatenate([data, masks]), alphas)
    survivors = [7, 0, 3, 5, 1]
    decoded = interpolate(F, [alphas[i] for i in survivors], coded[survivors], betas[:k_])
    np.testing.assert_array_equal(decoded, data)


def test_lagrange_errors() -> None:
    with pytest.raises(ConfigurationError, match="distinct"):
        lagrange_matrix(F, [1, 2, 1], [0])
    with pytest.raises(ConfigurationError, match="at least one node"):
        lagrange_matrix(F, [], [0])
    with pytest.raises(ConfigurationError, match="1-D"):
        lagrange_matrix(F, [[1, 2]], [0])
    with pytest.raises(ConfigurationError, match="PrimeField"):
        lagrange_matrix(Z2_64, [1, 2], [0])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="elements must lie"):
        lagrange_matrix(F, [1, F.p], [0])
    with pytest.raises(ConfigurationError, match="one row per node"):
        interpolate(F, [1, 2], F.zeros((3, 2)), [0])
    with pytest.raises(ConfigurationError, match="one row per node"):
        interpolate(F, [1], F.zeros(()), [0])


# ---------------------------------------------------------------------------------- Beaver


def _open(ring: Ring, parts: list[np.ndarray]) -> np.ndarray:
    return additive_reconstruct(ring, parts)


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@pytest.mark.parametrize("n", [2, 3, 5])
@given(shape=st.sampled_from([(1,), (6,), (2, 3)]), seed=st.integers(0, 2**32 - 1))
def test_beaver_elementwise(ring: Ring, n: int, shape: tuple[int, ...], seed: int) -> None:
    x, y = _random(ring, shape, seed), _random(ring, shape, seed + 1)
    xs = additive_share(ring, x, n, _prg(seed + 2))
    ys = additive_share(ring, y, n, _prg(seed + 3))
    dealer = Dealer.fresh(ring, n)
    triples = dealer.triple_shares(TripleShape.elementwise(shape), label=seed)
    masked = [beaver_mask(ring, xs[i], ys[i], triples[i]) for i in range(n)]
    d = _open(ring, [m[0] for m in masked])
    e = _open(ring, [m[1] for m in masked])
    z = [beaver_mul(ring, i, d, e, triples[i]) for i in range(n)]
    np.testing.assert_array_equal(_open(ring, z), ring.mul(x, y))


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@pytest.mark.parametrize("n", [2, 3])
@given(
    dims=st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(1, 5)),
    seed=st.integers(0, 2**32 - 1),
)
def test_beaver_matmul(ring: Ring, n: int, dims: tuple[int, int, int], seed: int) -> None:
    m_, k_, n_ = dims
    x, y = _random(ring, (m_, k_), seed), _random(ring, (k_, n_), seed + 1)
    xs = additive_share(ring, x, n, _prg(seed + 2))
    ys = additive_share(ring, y, n, _prg(seed + 3))
    triples = Dealer.fresh(ring, n).triple_shares(TripleShape.for_matmul(m_, k_, n_), label=1)
    masked = [beaver_mask(ring, xs[i], ys[i], triples[i]) for i in range(n)]
    d = _open(ring, [mk[0] for mk in masked])
    e = _open(ring, [mk[1] for mk in masked])
    z = [beaver_matmul(ring, i, d, e, triples[i]) for i in range(n)]
    np.testing.assert_array_equal(_open(ring, z), ring.matmul(x, y))


@pytest.mark.parametrize("ring", [Z2_64, F], ids=_ids)
def test_seeded_triples_are_valid_and_reproducible(ring: Ring) -> None:
    seeds = tuple(bytes([i]) * 16 for i in range(3))
    dealer = Dealer(ring, seeds)
    for shape in (TripleShape.elementwise((4, 2)), TripleShape.for_matmul(3, 4, 2)):
        correction = dealer.triple(shape, label=7)
        # Each party derives its share from its own seed; only the last needs the correction.
        parties = [PartyRandomness(ring, seeds[i], i, 3) for i in range(3)]
        shares = [
            p.triple(shape, 7, correction if p.receives_corrections else None) for p in parties
        ]
        a = _open(ring, [s.a for s in shares])
        b = _open(ring, [s.b for s in shares])
        c = _open(ring, [s.c for s in shares])
        want = ring.mul(a, b) if shape.kind == "elementwise" else ring.matmul(a, b)
        np.testing.assert_array_equal(c, want)
        assert c.shape == shape.c
        # Same (seed, label): the same shares; another label: fresh ones.
        again = dealer.triple_shares(shape, 7)
        np.testing.assert_array_equal(again[0].a, shares[0].a)
        np.testing.assert_array_equal(again[2].c, shares[2].c)
        other = dealer.triple_shares(shape, 8)
        assert not np.array_equal(other[0].a, shares[0].a)


@pytest.mark.parametrize("ring", [Z2_64, F], ids=_ids)
@pytest.mark.parametrize("n", [2, 3])
def test_seeded_input_sharing(ring: Ring, n: int) -> None:
    # The dealer's input: parties i < n - 1 derive their shares from their seeds, the last gets
    # the one message; they reconstruct x, and each label gives fresh shares.
    dealer = Dealer.fresh(ring, n)
    x = _random(ring, (4, 3), 77)
    message = dealer.share_input(x, label=5)
    shares = [dealer.party(i).input_share((4, 3), 5) for i in range(n - 1)]
    shares.append(dealer.party(n - 1).input_share((4, 3), 5, message))
    np.testing.assert_array_equal(_open(ring, shares), x)
    assert not np.array_equal(dealer.party(0).input_share((4, 3), 6), shares[0])
    # Input shares and triples under one label come from separate streams.
    triple = dealer.triple_shares(TripleShape.elementwise((4, 3)), 5)[0]
    assert not np.array_equal(triple.a, shares[0])
    with pytest.raises(ShareError, match="needs the dealer"):
        dealer.party(n - 1).input_share((4, 3), 5)
    with pytest.raises(ShareError, match="no correction"):
        dealer.party(0).input_share((4, 3), 5, message)
    with pytest.raises(ShareError, match="shape"):
        dealer.party(n - 1).input_share((4, 3), 5, message[:2])


def test_beaver_fixed_point_matmul_with_truncation() -> None:
    # PrivHFL's linear layer in miniature: 20-bit fixed point in Z_2^64, two parties, a dealt
    # matmul triple, then SecureML truncation; the result is X @ W within the fixed-point error.
    fp = FixedPoint(frac_bits=20, max_abs=8.0, max_summands=1)
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-4, 4, (5, 16)), rng.uniform(-1, 1, (16, 3))
    xs = additive_share(Z2_64, fp.encode_exact(x), 2, _prg(1))
    ws = additive_share(Z2_64, fp.encode_exact(w), 2, _prg(2))
    triples = Dealer.fresh(Z2_64, 2).triple_shares(TripleShape.for_matmul(5, 16, 3), 0)
    masked = [beaver_mask(Z2_64, xs[i], ws[i], triples[i]) for i in range(2)]
    d = _open(Z2_64, [m[0] for m in masked])
    e = _open(Z2_64, [m[1] for m in masked])
    z = [beaver_matmul(Z2_64, i, d, e, triples[i]) for i in range(2)]  # 40 fractional bits
    zt = [truncate_local(Z2_64, i, z[i], 20) for i in range(2)]
    got = fp.decode(_open(Z2_64, zt))
    # Encoding error 2^-21 per factor over 16 terms, plus one truncation ulp.
    bound = 16 * (4 + 1) * 2.0**-21 + 2.0**-20
    assert np.max(np.abs(got - x @ w)) < bound


def test_beaver_errors() -> None:
    ring = Z2_64
    triple = Dealer.fresh(ring, 2).triple_shares(TripleShape.elementwise(3), 0)[0]
    with pytest.raises(ConfigurationError, match="do not match the triple"):
        beaver_mask(ring, ring.zeros(4), ring.zeros(3), triple)
    with pytest.raises(ShareError, match="do not match the triple"):
        beaver_mul(ring, 0, ring.zeros(4), ring.zeros(3), triple)
    with pytest.raises(ConfigurationError, match="party"):
        beaver_mul(ring, -1, ring.zeros(3), ring.zeros(3), triple)
    mt = Dealer.fresh(ring, 2).triple_shares(TripleShape.for_matmul(2, 3, 4), 0)[0]
    with pytest.raises(ShareError, match="matmul triple"):
        beaver_matmul(ring, 0, ring.zeros((3, 2)), ring.zeros((3, 4)), mt)


def test_triple_shape_errors() -> None:
    with pytest.raises(ConfigurationError, match="one shape"):
        TripleShape("elementwise", (2,), (3,))
    with pytest.raises(ConfigurationError, match=r"\(m, k\) and \(k, n\)"):
        TripleShape.for_matmul(2, 3, 4).__class__("matmul", (2, 3), (4, 4))
    with pytest.raises(ConfigurationError, match="kind"):
        TripleShape("outer", (2,), (2,))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="non-negative"):
        TripleShape.elementwise(-1)
    assert TripleShape.elementwise(5).c == (5,)
    assert TripleShape.for_matmul(2, 3, 4).c == (2, 4)


def test_dealing_errors() -> None:
    seeds = (bytes(16), bytes([1]) * 16)
    shape = TripleShape.elementwise(2)
    with pytest.raises(ConfigurationError, match=">= 2"):
        Dealer(Z2_64, seeds[:1])
    with pytest.raises(ConfigurationError, match="16 bytes"):
        Dealer(Z2_64, (bytes(16), b"short"))
    with pytest.raises(ConfigurationError, match="distinct"):
        Dealer(Z2_64, (bytes(16), bytes(16)))
    with pytest.raises(ConfigurationError, match="Ring"):
        Dealer("Z2_64", seeds)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="party must be in"):
        PartyRandomness(Z2_64, seeds[0], 2, 2)
    with pytest.raises(ConfigurationError, match="n_parties"):
        PartyRandomness(Z2_64, seeds[0], 0, 1)
    with pytest.raises(ConfigurationError, match="16 bytes"):
        PartyRandomness(Z2_64, b"x", 0, 2)
    with pytest.raises(ConfigurationError, match="Ring"):
        PartyRandomness(None, seeds[0], 0, 2)  # type: ignore[arg-type]
    first, last = PartyRandomness(Z2_64, seeds[0], 0, 2), PartyRandomness(Z2_64, seeds[1], 1, 2)
    with pytest.raises(ShareError, match="no correction"):
        first.triple(shape, 0, Z2_64.zeros(2))
    with pytest.raises(ShareError, match="needs the dealer"):
        last.triple(shape, 0)
    # A malformed correction from the dealer is the dealer's fault: ShareError.
    with pytest.raises(ShareError, match="shape"):
        last.triple(shape, 0, Z2_64.zeros(3))
    with pytest.raises(ShareError, match="uint64"):
        last.triple(shape, 0, np.zeros(2, dtype=np.int64))
    with pytest.raises(ShareError, match="not an element"):
        PartyRandomness(F, seeds[1], 1, 2).triple(shape, 0, np.full(2, F.p, dtype=U64))
    with pytest.raises(ConfigurationError, match="index"):
        first.triple(shape, -1)
    # Seeds never show in a repr (logs).
    assert seeds[1].hex() not in repr(Dealer(Z2_64, seeds)) + repr(last)
    assert repr(seeds[1]) not in repr(Dealer(Z2_64, seeds)) + repr(last)


# ---------------------------------------------------------------------------------- truncation


def _floor_div(x: int, f: int) -> int:
    return x >> f  # Python's >> on negative ints is floor division by 2^f


@given(
    x=st.integers(-(2**62), 2**62 - 1),
    x0=st.integers(0, 2**64 - 1),
    f=st.integers(0, 40),
)
def test_truncate_local_exact_characterisation(x: int, x0: int, f: int) -> None:
    # u = x_0 and v = -x_1 mod 2^64 are what the parties shift; w = u - v is congruent to x.
    # Exactly: result = floor(w / 2^f) + [u mod 2^f < w mod 2^f], and w == x (no wrap) unless
    # u < x (x >= 0) or u >= 2^64 + x (x < 0); a wrap shifts the result by -+2^(64-f).
    k = 64
    x1 = (x - x0) % 2**k
    shares = [np.array([x0], dtype=U64), np.array([x1], dtype=U64)]
    out = [truncate_local(Z2_64, i, shares[i], f) for i in range(2)]
    got = int(_open(Z2_64, out)[0])
    u, v = x0, (-x1) % 2**k
    w = u - v
    carry = int(u % 2**f < w % 2**f)
    assert got == (_floor_div(w, f) + carry) % 2**k
    wraps = (x >= 0 and u < x) or (x < 0 and u >= 2**k + x)
    assert (w != x) == wraps
    if not wraps:
        assert (got - _floor_div(x, f)) % 2**k == carry
    else:
        assert w == x - 2**k if x >= 0 else w == x + 2**k


def test_truncate_local_forced_wrap_is_off_by_2_to_the_k_minus_f() -> None:
    x, f = 5 << 20, 20
    x0 = 3  # u = 3 < x: the wrap window
    out = [
        truncate_local(Z2_64, 0, np.array([x0], dtype=U64), f),
        truncate_local(Z2_64, 1, np.array([(x - x0) % 2**64], dtype=U64), f),
    ]
    got = int(_open(Z2_64, out)[0])
    assert (got - 5) % 2**64 == 2**64 - 2**44


@pytest.mark.parametrize("ring", [Z2_64, Z2k(32)], ids=_ids)
def test_truncate_local_error_bound_empirically(ring: Z2k) -> None:
    # |x| < 2^l with l = k - 24: wraps have probability |x| / 2^k < 2^-24 per value, so none
    # in 2e5 samples (fixed seed); every result is floor(x / 2^f) or one more, and unbiased.
    k, f, n = ring.bits, 12, 200_000
    l_bits = k - 24
    rng = np.random.default_rng(11)
    x = rng.integers(-(2**l_bits) + 1, 2**l_bits, n)
    shares = additive_share(ring, ring.encode_signed(x), 2, _prg(12))
    out = [truncate_local(ring, i, shares[i], f) for i in range(2)]
    got = _signed(ring, _open(ring, out))
    err = got - np.floor_divide(x, 2**f)
    assert set(np.unique(err).tolist()) <= {0, 1}
    # Stochastic rounding: E[got] = x / 2^f; the mean error is ~0 (std ~ 0.5 / sqrt(n)).
    assert abs(float(np.mean(got - x / 2.0**f))) < 0.01


def test_truncate_local_failure_rate_matches_abs_x_over_2_to_the_k() -> None:
    # With |x| up to 2^62 wraps are common; their count must match sum |x| / 2^64.
    n, f = 100_000, 16
    rng = np.random.default_rng(5)
    x = rng.integers(-(2**62), 2**62, n)
    shares = additive_share(Z2_64, Z2_64.encode_signed(x), 2, _prg(6))
    out = [truncate_local(Z2_64, i, shares[i], f) for i in range(2)]
    got = _signed(Z2_64, _open(Z2_64, out))
    failures = int(np.count_nonzero((got - np.floor_divide(x, 2**f)) > 1)) + int(
        np.count_nonzero((got - np.floor_divide(x, 2**f)) < 0)
    )
    expected = float(np.sum(np.abs(x.astype(np.float64)))) / 2.0**64
    assert abs(failures - expected) < 6 * np.sqrt(expected)
    assert expected > 5000  # the test has teeth


@pytest.mark.parametrize("n", [2, 3, 5])
def test_dealer_truncation(n: int) -> None:
    ring, f, l_bits, size = Z2_64, 20, 44, 50_000
    rng = np.random.default_rng(n)
    x = rng.integers(-(2**l_bits) + 1, 2**l_bits, size)
    xs = additive_share(ring, ring.encode_signed(x), n, _prg(n))
    pairs = Dealer.fresh(ring, n).truncation_pair_shares((size,), f, label=3)
    c = _open(ring, [truncate_mask(ring, i, xs[i], pairs[i], l_bits) for i in range(n)])
    out = [truncate_finish(ring, i, c, pairs[i], l_bits) for i in range(n)]
    got = _signed(ring, _open(ring, out))
    r = _open(ring, [p.r for p in pairs])
    # Exact characterisation: no wrap iff X + r < 2^64 with X = x + 2^l.
    big_x = x + 2**l_bits
    wrap = r.astype(object) + big_x.astype(object) >= 2**64
    err = got - np.floor_divide(x, 2**f)
    assert set(np.unique(err[~wrap]).tolist()) <= {0, 1}
    assert np.all(err[wrap] != 0) and np.all(err[wrap] != 1)
    assert int(np.count_nonzero(wrap)) <= 2  # probability < 2^(l+1-64) = 2^-19 each
    assert abs(float(np.mean(got[~wrap] - x[~wrap] / 2.0**f))) < 0.01
    # The dealt pair is consistent: (r >> f) reconstructs.
    np.testing.assert_array_equal(_open(ring, [p.r_shifted for p in pairs]), r >> U64(f))


def test_dealer_truncation_from_seeds_matches_the_simulation() -> None:
    seeds = (bytes([5]) * 16, bytes([6]) * 16)
    dealer = Dealer(Z2_64, seeds)
    fix = dealer.truncation_pair((4,), 8, 2)
    last = PartyRandomness(Z2_64, seeds[1], 1, 2).truncation_pair((4,), 8, 2, fix)
    sim = dealer.truncation_pair_shares((4,), 8, 2)
    np.testing.assert_array_equal(last.r_shifted, sim[1].r_shifted)
    np.testing.assert_array_equal(last.r, sim[1].r)
    assert last.frac_bits == 8
    # Truncation pairs and triples with one label draw from separate streams.
    triple = dealer.triple_shares(TripleShape.elementwise(4), 2)
    assert not np.array_equal(triple[0].a, sim[0].r)


def test_truncation_errors() -> None:
    share = Z2_64.zeros(3)
    with pytest.raises(ConfigurationError, match="Z_2\\^k"):
        truncate_local(F, 0, F.zeros(3), 4)
    with pytest.raises(ConfigurationError, match="party"):
        truncate_local(Z2_64, 2, share, 4)
    with pytest.raises(ConfigurationError, match="frac_bits"):
        truncate_local(Z2_64, 0, share, 64)
    with pytest.raises(ConfigurationError, match="Z_2\\^k"):
        Dealer.fresh(F, 2).truncation_pair((3,), 4, 0)
    pairs = Dealer.fresh(Z2_64, 2).truncation_pair_shares((3,), 8, 0)
    with pytest.raises(ConfigurationError, match="bound_bits"):
        truncate_mask(Z2_64, 0, share, pairs[0], 7)  # l < f
    with pytest.raises(ConfigurationError, match="bound_bits"):
        truncate_mask(Z2_64, 0, share, pairs[0], 63)  # l > k - 2
    with pytest.raises(ConfigurationError, match="does not match"):
        truncate_mask(Z2_64, 0, Z2_64.zeros(4), pairs[0], 20)
    with pytest.raises(ShareError, match="does not match"):
        truncate_finish(Z2_64, 0, Z2_64.zeros(4), pairs[0], 20)
    with pytest.raises(ConfigurationError, match="Z_2\\^k"):
        truncate_finish(F, 0, F.zeros(3), pairs[0], 20)
    with pytest.raises(ConfigurationError, match="frac_bits"):
        Dealer.fresh(Z2k(16), 2).truncation_pair((3,), 16, 0)
    last = Dealer.fresh(Z2_64, 2).party(1)
    with pytest.raises(ShareError, match="shape"):
        last.truncation_pair((3,), 8, 0, Z2_64.zeros(2))
    with pytest.raises(ShareError, match="needs the dealer"):
        last.truncation_pair((3,), 8, 0)
