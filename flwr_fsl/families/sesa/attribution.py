"""SESA attribution: who is excluded when sealed evaluations do not open, and plausibility bounds.

Flower-free. Client ``j``'s offline evaluations for client ``i`` are sealed to ``i`` and relayed
by the server, so only ``i`` can check them. Before anything about ``U3`` is revealed, the
``train`` request hands each client of ``U2`` its mailbox (the pieces the others of ``U2``
sealed to it, :func:`~flwr_fsl.families.sesa.messages.mailbox_to_bytes`); the client opens every
one (:func:`unopened`) and its masked update carries a *complaint*: the senders whose piece did
not open or did not decode (``FSEX`` v2). A client never raises over another client's piece.

**Rule** (:func:`resolve_complaints`; the server cannot check a complaint — only the recipient
can open the piece):

* a complaint naming exactly **one** sender excludes that sender from ``U3`` (its masked update
  is not aggregated; it is dropped with a reason naming the complainers); the complainer stays;
* a complaint naming **two or more** senders excludes only the **complainer** (one client
  cannot tell about several others' faults without being the likelier liar); the senders it
  named stay unless another complaint names them alone.

So one lying complainer excludes at most one honest client (the sender it names) or only
itself, and a client that corrupts any number of its pieces — or replays another round's
bundle, which is sealed to that round's keys and binding and never opens — is excluded alone,
consistently for every recipient: nobody evaluates ``ψ`` until ``U3`` is settled, and every
survivor evaluates over the same ``U3``. Two clients naming each other both go.

**Bounds** (:func:`check_plausible`): the decoded per-shard sums of a round are refused —
the round fails with the model unchanged — when a count word lies outside
``[0, |U3|]`` (total weight at most survivors × the largest weight, 1 after the division by
``max_weight``), the count words of a group do not add up to ``Σ K_i`` over ``U3`` (exactly, at
unit weights; at most, weighted), or a coordinate's ``|Σ c·Δ|`` exceeds ``clip × Σ c`` (plus the
fixed point's rounding, one step per contributor). A masked update is bound to its round's
parameters (``FSEX`` v2 carries their digest), so a replay from another round is refused as
malformed and drops its sender. Inside the bounds a deviating client can still shift the
shards it contributes to, as any client that trains on other data can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import RoundFailedError
from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair, client_party
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.sealing import open_from
from flwr_fsl.families.sesa.messages import (
    SesaError,
    SesaGroup,
    SesaParams,
    _decode_piece,
    mailbox_from_bytes,
)

__all__ = ["PIECE_PURPOSE", "check_plausible", "resolve_complaints", "unopened"]

PIECE_PURPOSE = "sesa-evaluations"
"""Sealing purpose of the evaluations one client sends another (relayed by the server)."""


def open_piece(
    key: SealingKeyPair,
    params: SesaParams,
    sender: int,
    recipient: int,
    blob: bytes,
    slots: Sequence[int],
) -> list[tuple[NDArray[np.uint64], NDArray[np.uint64]]]:
    """Open and decode the evaluations ``sender`` sealed to ``recipient``.

    Raises
    ------
    SesaError
        If the piece does not open (another round, run, key or a corrupted byte) or does not
        decode for the sender's slots.
    """
    try:
        plain = open_from(
            key, blob, purpose=PIECE_PURPOSE, binding=params.binding,
            sender=client_party(sender), recipient=client_party(recipient),
        )  # fmt: skip
    except SealedBoxError as err:
        raise SesaError(f"the evaluations from client {sender} do not open") from err
    return _decode_piece(plain, params, sender, recipient, slots)


def unopened(
    node: int,
    key: SealingKeyPair,
    params: SesaParams,
    sharers: Sequence[int],
    mailbox: bytes,
) -> tuple[int, ...]:
    """Open every piece of a client's mailbox; return the senders whose piece failed.

    Parameters
    ----------
    node : int
        The recipient.
    key : SealingKeyPair
        Its round key.
    params : SesaParams
        The round.
    sharers : sequence of int
        ``U2``; the mailbox must hold one piece from each other member.
    mailbox : bytes
        ``FSEM`` bytes.

    Returns
    -------
    tuple of int
        The complaint: senders (sorted) whose piece did not open or decode.

    Raises
    ------
    SesaError
        If the mailbox itself is malformed or does not cover exactly ``U2`` without this client
        (the server's message, not another client's).
    """
    entries = mailbox_from_bytes(mailbox, params)
    if set(entries) != set(sharers) - {node}:
        raise SesaError("the mailbox must hold one piece from every other member of U2")
    bad = []
    for j, (slots, blob) in sorted(entries.items()):
        try:
            open_piece(key, params, j, node, blob, slots)
        except SesaError:
            bad.append(j)
    return tuple(bad)


def resolve_complaints(
    complaints: Mapping[int, Sequence[int]], members: Sequence[int]
) -> dict[int, str]:
    """Apply the module's rule; return node -> reason for every member to exclude.

    Parameters
    ----------
    complaints : Mapping[int, Sequence[int]]
        Complainer -> the senders it named (only complaints of ``members`` count).
    members : sequence of int
        The clients whose masked update was accepted (the candidates for ``U3``).
    """
    among = set(members)
    single: dict[int, list[int]] = {}
    out: dict[int, str] = {}
    for i, named in sorted(complaints.items()):
        names = sorted({j for j in named if j in among and j != i})
        if i not in among or not names:
            continue
        if len(names) == 1:
            single.setdefault(names[0], []).append(i)
        else:
            out[i] = (
                f"complained that the evaluations of {len(names)} clients {names} do not open: "
                "the server cannot check a complaint, so one naming several senders excludes "
                "only the complainer"
            )
    for j, by in sorted(single.items()):
        reason = f"its sealed evaluations did not open for client(s) {by}"
        out[j] = f"{out[j]}; {reason}" if j in out else reason
    return out


def check_plausible(
    groups: Sequence[SesaGroup],
    totals: Sequence[NDArray[np.uint64]],
    codec: FixedPoint,
    slots: Mapping[int, Sequence[int]],
    clip: float,
    *,
    weighted: bool,
) -> None:
    """Refuse decoded per-shard sums outside their provable bounds (module docstring).

    Parameters
    ----------
    groups : sequence of SesaGroup
        The round's groups (``length`` words: the shard's values and its count word).
    totals : sequence of numpy.ndarray
        Per group the ``(K, d)`` decoded sums in ``F_p``.
    codec : FixedPoint
        The round's fixed point.
    slots : Mapping[int, Sequence[int]]
        ``K_i`` per group of every client of ``U3``.
    clip : float
        The clipping range.
    weighted : bool
        Whether weights other than 1 were allowed (count words then need not be integers).

    Raises
    ------
    RoundFailedError
        Naming the first bound that fails (the model is then unchanged).
    """
    n = len(slots)
    step = n / codec.scale
    for g, (group, total) in enumerate(zip(groups, totals, strict=True)):
        values = codec.decode(total)
        counts, sums = values[:, group.length - 1], values[:, : group.length - 1]
        chosen = sum(int(k[g]) for k in slots.values())
        where = f"SESA aggregate of group {g} outside its bounds"
        if np.any(counts < -step) or np.any(counts > n + step):
            raise RoundFailedError(f"{where}: a count word outside [0, {n}] (a client deviated)")
        if not weighted and (
            np.any(counts != np.round(counts)) or int(np.round(counts).sum()) != chosen
        ):
            raise RoundFailedError(
                f"{where}: the count words are not the {chosen} shards U3 chose (a client deviated)"
            )
        if weighted and counts.sum() > chosen + step * len(counts):
            raise RoundFailedError(f"{where}: the count words exceed the {chosen} shards U3 chose")
        bound = clip * np.maximum(counts, 0.0) + step
        if np.any(np.abs(sums) > bound[:, None]):
            raise RoundFailedError(
                f"{where}: a coordinate exceeds clipping range times total weight"
            )
