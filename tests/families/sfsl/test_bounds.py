"""SFSL's rows-sum bounds (issue 24): honest sums at the edge pass, others fail the round."""

from __future__ import annotations

import os

import numpy as np
import pytest

from flwr_fsl.core.errors import ClientInputError, RoundFailedError
from flwr_fsl.families.sfsl.bounds import check_rows_sum, check_union_counts
from flwr_fsl.families.sfsl.dp import RowsRound, rows_input
from flwr_fsl.families.sfsl.messages import SFSLSettings
from flwr_fsl.families.sfsl.protocol import RowVector

U64 = np.uint64
M, D = 10, 3
UNION = np.array([1, 3, 4, 7], dtype=np.int64)


def _sum(settings: SFSLSettings, n: int, sign: float) -> tuple[RowVector, np.ndarray, np.ndarray]:
    """``n`` clients holding every union row, at the largest count, weight and clipped delta."""
    layout, length = settings.layout(UNION, D, 5)
    model = {"emb": np.zeros((M, D)), "fc": np.zeros(5)}
    trained = {"emb": np.full((M, D), sign * 9.0), "fc": np.full(5, sign * 9.0)}
    top = settings.max_count if settings.weighted else 1.0
    peers = RowsRound("emb", settings.clip, None, 2, n, {}, settings.max_count)
    total = np.zeros(length, dtype=U64)
    for _ in range(n):
        real = (UNION, np.full(UNION.size, top))
        words, positions = rows_input(layout, peers, UNION, model, trained, top, real, length)
        total[positions] += words
    return layout, total, np.full(UNION.size, n, dtype=np.int64)


@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "unit"])
@pytest.mark.parametrize("levels", [0, 2**15], ids=["fixed", "quantized"])
def test_honest_rows_sums_pass_and_others_fail(weighted: bool, levels: int) -> None:
    settings = SFSLSettings("emb", clip=2.0, max_count=10.0, levels=levels, weighted=weighted)
    survivors = [1000, 1001, 1002]
    for sign in (1.0, -1.0):
        layout, total, alive = _sum(settings, 3, sign)
        check_rows_sum(layout, layout.codec.decode(total), settings, alive, survivors)
    for _ in range(10):  # a replayed or shifted input: uniform words on top
        garbage = np.frombuffer(os.urandom(8 * total.size), dtype=U64)
        values = layout.codec.decode(total + garbage)
        with pytest.raises(RoundFailedError, match=r"outside its bounds.*1002"):
            check_rows_sum(layout, values, settings, alive, survivors)
    with pytest.raises(RoundFailedError, match="outside its bounds"):  # one survivor too few
        check_rows_sum(layout, layout.codec.decode(total), settings, alive - 1, survivors[:2])


def test_a_client_refuses_a_count_above_max_count() -> None:
    settings = SFSLSettings("emb", clip=2.0, max_count=10.0)
    layout, length = settings.layout(UNION, D, 5)
    model = {"emb": np.zeros((M, D)), "fc": np.zeros(5)}
    peers = RowsRound("emb", 2.0, None, 2, 3, {}, settings.max_count)
    real = (UNION, np.full(UNION.size, 11.0))
    with pytest.raises(ClientInputError, match="max_count"):
        rows_input(layout, peers, UNION, model, model, 1.0, real, length)


def test_union_counts_bounds() -> None:
    check_union_counts(np.array([0.0, 3.0, 1.5]), 0.1, [1, 2, 3])
    with pytest.raises(RoundFailedError, match="union count"):
        check_union_counts(np.array([0.0, 1e9]), 0.1, [1, 2, 3])
