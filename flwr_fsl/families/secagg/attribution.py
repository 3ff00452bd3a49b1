"""Who lied in Unmask: one holder whose shares are off the polynomial of several secrets.

In Unmask every survivor returns its shares of the other clients' secrets; with more than
``t`` shares of a secret the server can check that they lie on one polynomial. Shares off it
mean that the secret's dealer dealt inconsistent shares or a holder returned a wrong one. One
deviating *dealer* can only spoil its own secret, so when a single holder ``h`` is the one
outlier of the secrets of **two or more** dealers other than itself (and leaving ``h`` out makes
every secret consistent), ``h`` lied: :func:`find_liar` names it, the server ignores its shares
(its masked input stays in the sum: the others' shares recover its mask) and the round drops it
with that reason. Otherwise the server cannot tell who lied, and the round fails naming the
dealer and its holders. Limit (stated in ``docs/families/secagg.md``): two colluding dealers
could each deal one bad share to the same honest holder and so get its Unmask reply ignored and
that holder recorded as dropped — which changes nothing in the sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.crypto.sharing import Shamir

__all__ = ["find_liar"]

Shares = Mapping[int, Mapping[int, NDArray[np.uint64]]]
"""Dealer -> holder -> the holder's share of the dealer's secret."""


def _consistent(scheme: Shamir, order: Sequence[int], holders: Mapping[int, object]) -> bool:
    parties = sorted(holders)
    if len(parties) <= scheme.threshold + 1:
        return True  # nothing beyond the t shares that define the polynomial to check
    try:
        scheme.reconstruct([order.index(p) for p in parties], [holders[p] for p in parties])
    except ClientInputError:
        return False
    return True


def find_liar(scheme: Shamir, order: Sequence[int], shares: Shares) -> int | None:
    """Return the one holder whose shares alone break two or more dealers' secrets, or None.

    Parameters
    ----------
    scheme : Shamir
        The round's sharing (degree ``t - 1``).
    order : sequence of int
        The roster in party order.
    shares : Mapping
        Dealer -> holder -> share.

    Returns
    -------
    int or None
        The holder to ignore, or None if every secret is consistent or no single holder can be
        blamed (module docstring).
    """
    bad = [v for v, holders in shares.items() if not _consistent(scheme, order, holders)]
    if not bad:
        return None
    first = shares[bad[0]]
    suspects = [
        h
        for h in first
        if _consistent(scheme, order, {p: s for p, s in first.items() if p != h})
        and len(first) - 1 > scheme.threshold + 1
    ]
    if len(suspects) != 1:
        return None
    liar = suspects[0]
    if len({v for v in bad if v != liar}) < 2:
        return None
    for v in bad:
        if not _consistent(scheme, order, {p: s for p, s in shares[v].items() if p != liar}):
            return None
    return liar
