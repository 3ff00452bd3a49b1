"""PrivHFL's share im2col (:func:`~flwr_fsl.kernels.ring.im2col_nhwc`, session 35) against the
numpy form it replaced in the protocol (:func:`~flwr_fsl.families.privhfl.inference.nhwc_patches`,
still the plaintext path's): the same words for any shape, kernel, stride and padding."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flwr_fsl.families.privhfl.inference import Conv2d, nhwc_patches
from flwr_fsl.families.privhfl.ops import _patches
from flwr_fsl.kernels.ring import im2col_nhwc

U64 = np.uint64


@settings(max_examples=120, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 5)),
    geometry=st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2)),
    seed=st.integers(0, 2**32 - 1),
)
def test_im2col_matches_nhwc_patches(
    shape: tuple[int, int, int, int], geometry: tuple[int, int, int], seed: int
) -> None:
    _, h, w, c = shape
    k, stride, padding = geometry
    assume(h + 2 * padding >= k and w + 2 * padding >= k)
    x = np.random.default_rng(seed).integers(0, 2**64, shape, dtype=U64, endpoint=False)
    want = np.ascontiguousarray(nhwc_patches(x, k, stride, padding))
    out = np.full(want.shape, U64(7))  # every word is written
    im2col_nhwc(x, k, stride, padding, out)
    assert np.array_equal(out, want)
    layer = Conv2d(c, 2, k, stride, padding)
    assert np.array_equal(_patches(x, layer), want)
    strided = np.asfortranarray(x)  # any layout
    im2col_nhwc(strided, k, stride, padding, out)
    assert np.array_equal(out, want)
