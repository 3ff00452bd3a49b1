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
