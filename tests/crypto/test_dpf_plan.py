"""The GIL-free evaluation plan (:func:`flwr_fsl.kernels.dpf_eval.fd_plan`, issue 26).

It must give exactly the plan of the separate steps it replaces in
:func:`~flwr_fsl.crypto.dpf.evaluate_batch` (cumsum of the lengths, the keys' tree levels,
:func:`~flwr_fsl.kernels.dpf_eval.fd_tasks`, :func:`~flwr_fsl.kernels.dpf_eval.fd_chunks`), on
whole batches and on the segments a server cuts them into, and refuse the same inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.threads import run_ranges
from flwr_fsl.crypto.dpf import evaluate_batch, generate_keys_batch, key_range
from flwr_fsl.crypto.dpf_keys import _tree_levels
from flwr_fsl.families.ssa.verify import segments
from flwr_fsl.kernels import dpf_eval as fde


def _old_plan(bits, lengths, roots, party, group, per_leaf, budget):  # type: ignore[no-untyped-def]
    """The steps evaluate_batch ran before fd_plan (session 33's prologue)."""
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    levels = _tree_levels(bits, 1 if group == 2 else 2)  # odd tau: 2 points per leaf
    tasks, seeds, t = fde.fd_tasks(levels, offsets, roots, party)
    bounds, cap, desc = fde.fd_chunks(tasks, group, per_leaf, budget)
    assert desc
    return offsets, tasks, seeds, t, bounds, cap


@st.composite
def _batches(draw):  # type: ignore[no-untyped-def]
    m = draw(st.integers(0, 40))
    bits = np.array(draw(st.lists(st.integers(0, 10), min_size=m, max_size=m)), dtype=np.uint8)
    kinds = draw(st.lists(st.sampled_from(["zero", "full", "any"]), min_size=m, max_size=m))
    fracs = draw(st.lists(st.floats(0, 1), min_size=m, max_size=m))
    lengths = np.array(
        [
            0 if k == "zero" else (1 << int(b)) if k == "full" else int(f * (1 << int(b)))
            for k, b, f in zip(kinds, bits, fracs, strict=True)
        ],
        dtype=np.int64,
    )
    roots = np.random.default_rng(draw(st.integers(0, 2**32))).integers(
        0, 2**64, size=(m, 2), dtype=np.uint64
    )
    return bits, lengths, roots


@settings(max_examples=150, deadline=None)
@given(
    batch=_batches(),
    party=st.integers(0, 1),
    group=st.sampled_from([1, 2]),
    per_leaf=st.integers(1, 4),
    budget=st.sampled_from([1, 7, 64, 1 << 14]),
    seg_points=st.sampled_from([1, 5, 64, 1 << 16]),
)
def test_plan_equals_the_separate_steps_per_segment(  # type: ignore[no-untyped-def]
    batch, party, group, per_leaf, budget, seg_points
):
    bits, lengths, roots = batch
    cuts = segments(lengths, seg_points) if lengths.shape[0] else [(0, 0)]
    for lo, hi in [(0, lengths.shape[0]), *cuts]:
        args = (bits[lo:hi], lengths[lo:hi], roots[lo:hi], party)
        status, *new = fde.fd_plan(*args, (group, per_leaf, budget))
        assert status == 0
        old = _old_plan(*args, group, per_leaf, budget)
        for a, b in zip(new[:-1], old[:-1], strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
        assert new[-1] == old[-1]


def _keys(tau: int = 2):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    bits = np.array([3, 0, 5, 4], dtype=np.int64)
    alphas = np.array([1, 0, 17, 9], dtype=np.uint64)
    betas = rng.integers(0, 2**64, size=(4, tau), dtype=np.uint64)
    return generate_keys_batch(alphas, betas, bits)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_int64_lengths_and_converted_lengths_evaluate_alike(threads: int) -> None:
    k0, _ = _keys()
    lengths = np.array([8, 1, 20, 0], dtype=np.int64)
    want, off = evaluate_batch(k0, lengths=lengths.tolist())  # converted in Python
    got, off2 = evaluate_batch(k0, lengths=lengths)  # straight into fd_plan
    np.testing.assert_array_equal(want, got)
    np.testing.assert_array_equal(off, off2)
    # Segments (key ranges) of the batch give its rows, on any number of threads.
    parts = segments(lengths, [1, 5, 8][threads - 1])

    def one(j: int) -> np.ndarray:
        lo, hi = parts[j]
        return evaluate_batch(key_range(k0, lo, hi), lengths=lengths[lo:hi])[0]

    rows = run_ranges(one, len(parts), threads)
    np.testing.assert_array_equal(np.concatenate(rows), want)


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        (np.array([8, -1, 20, 0], dtype=np.int64), "non-negative"),
        (np.array([9, 1, 20, 0], dtype=np.int64), "must not exceed"),
        (np.array([9, -1, 20, 0], dtype=np.int64), "non-negative"),  # negative checked first
        ([8, -1, 20, 0], "non-negative"),
        ([9, 1, 20, 0], "must not exceed"),
        (np.array([8, 1, 20], dtype=np.int64), "shape"),
        (np.array([8, 1, 20, 0, 0], dtype=np.int32), "shape"),
        (np.array([8.0, 1, 20, 0]), "integers"),
    ],
)
def test_bad_lengths_are_refused(lengths: object, message: str) -> None:
    k0, _ = _keys()
    with pytest.raises(ConfigurationError, match=message):
        evaluate_batch(k0, lengths=lengths)  # type: ignore[arg-type]


def test_no_lengths_is_the_whole_domain() -> None:
    k0, _ = _keys()
    full = np.left_shift(1, np.array([3, 0, 5, 4], dtype=np.int64))
    want, _ = evaluate_batch(k0, lengths=full)
    got, off = evaluate_batch(k0)
    np.testing.assert_array_equal(want, got)
    assert int(off[-1]) == int(full.sum())
