"""The curious server's decoders, shared by the attack tests.

Each function takes only what a server legitimately holds (released aggregates, the
participation it chose, weights it was sent) and returns its best guess of a client secret.
The attack tests compare the guess with the truth and with a stated chance baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "chance_membership_accuracy",
    "least_squares_per_client",
    "membership_accuracy",
    "subset_sum",
    "subset_sum_index",
    "summand_generators",
]


def subset_sum(
    total: float, weights: Sequence[float], *, tolerance: float = 1e-6, max_size: int | None = None
) -> list[tuple[int, ...]]:
    """Every subset of ``weights`` (as index tuples) whose sum is ``total`` within ``tolerance``.

    Exhaustive over subsets up to ``max_size`` (all sizes by default): the attack tests keep the
    round small enough (<= 16 clients) for that. A unique answer is an exact decode.
    """
    n = len(weights)
    top = n if max_size is None else min(max_size, n)
    found = []
    for size in range(top + 1):
        for combo in combinations(range(n), size):
            if abs(sum(weights[i] for i in combo) - total) <= tolerance:
                found.append(combo)
    return found


def subset_sum_index(
    weights: Sequence[float], *, decimals: int = 6
) -> dict[float, list[tuple[int, ...]]]:
    """Every non-empty subset of ``weights`` (index tuples) by its sum rounded to ``decimals``.

    The table form of :func:`subset_sum` for decoding many totals against the same weights
    (one round's count words): a total maps to a single subset exactly when it decodes.
    """
    table: dict[float, list[tuple[int, ...]]] = {}
    for size in range(1, len(weights) + 1):
        for combo in combinations(range(len(weights)), size):
            key = round(sum(weights[i] for i in combo), decimals)
            table.setdefault(key, []).append(combo)
    return table


def summand_generators(totals: Sequence[float], *, tolerance: float = 1e-6) -> list[float]:
    """The fewest summands whose subset sums explain ``totals``, smallest first (greedy).

    Released totals that are subset sums of unknown per-client numbers (count words of one
    round: sums of the weights of the clients that chose an element) give those numbers back:
    the smallest total is one of them, and each next total that no subset of the numbers
    found so far explains is another. Exact when every number shows up alone or is needed to
    explain some total (a coordinate only one client chose gives that client's weight).
    """
    found: list[float] = []
    sums = np.zeros(1)  # subset sums of ``found`` (the empty one included)
    for total in sorted(set(float(t) for t in totals if t > tolerance)):
        if np.min(np.abs(sums - total)) <= tolerance:
            continue
        found.append(total)
        sums = np.unique(np.concatenate([sums, sums + total]))
        if sums.size > 1 << 20:  # more than 20 summands: not a round's weights
            break
    return found


def least_squares_per_client(
    participation: NDArray[np.float64], observed: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Solve ``observed ≈ participation @ X`` for ``X`` by least squares.

    Parameters
    ----------
    participation : numpy.ndarray
        ``(rounds, clients)``: 1 where the client's contribution is in that round's release.
    observed : numpy.ndarray
        ``(rounds,)`` or ``(rounds, columns)``: the released sums (a total weight, per-row counts).

    Returns
    -------
    numpy.ndarray
        ``(clients,)`` or ``(clients, columns)``: each client's estimated fixed contribution
        (its weight, its per-row count).
    """
    solution, *_ = np.linalg.lstsq(participation, observed, rcond=None)
    return solution


def identifiable_clients(participation: NDArray[np.float64]) -> NDArray[np.bool_]:
    """``(clients,)``: whose contribution the releases determine (``e_j`` in the row space).

    Two clients that were always released together, for example, are not identifiable:
    least squares splits their sum between them.
    """
    rank = np.linalg.matrix_rank(participation)
    eye = np.eye(participation.shape[1])
    return np.array(
        [np.linalg.matrix_rank(np.vstack([participation, e])) == rank for e in eye], dtype=bool
    )


def membership_accuracy(
    estimate: NDArray[np.float64], truth: NDArray[np.bool_], threshold: float = 0.5
) -> float:
    """Fraction of (client, row) pairs whose membership the thresholded estimate gets right."""
    return float(np.mean((estimate > threshold) == truth))


def chance_membership_accuracy(truth: NDArray[np.bool_]) -> float:
    """The best accuracy without looking at any release: always guess the majority class.

    A server that knows only the base rate (e.g. how many rows a client holds) does this well;
    an attack is at chance when it does no better than this plus a stated margin.
    """
    rate = float(np.mean(truth))
    return max(rate, 1.0 - rate)
