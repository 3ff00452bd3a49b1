r"""Secure aggregation of Bonawitz et al. (CCS 2017), semi-honest, for one server and n clients.

Flower-free: :class:`SecAggClient` and :class:`SecAggServer` exchange bytes (and one vector of
ring words per client); ``secagg.strategy`` and ``secagg.mod`` carry them in Flower messages.
Clients never talk to each other: the server relays, and what one client sends another is
sealed to the recipient (:func:`flwr_fsl.crypto.channel.seal`, HPKE X25519 / AES-256-GCM).

**Rounds** (Bonawitz et al. Fig. 4, without the consistency check of the malicious model):

0. *AdvertiseKeys* — client ``u`` draws two X25519 key pairs: ``c_u`` (what others seal its
   shares to) and ``s_u`` (mask agreement), and sends both public keys. ``U1`` = senders.
1. *ShareKeys* — the server sends every ``u in U1`` the roster ``U1`` with its keys. ``u`` draws
   a 16-byte self-mask seed ``b_u`` and splits ``s_u``'s 32-byte private key and ``b_u`` into
   Shamir shares with reconstruction threshold ``t`` over ``F_p`` (``p = 2^32 - 5``, secrets in
   3-byte limbs, party ``v`` at the point ``1 + position of v in U1``); the share for ``v`` is
   sealed to ``c_v`` (:func:`flwr_fsl.crypto.sealing.seal_for`) with associated data naming
   purpose, session, round, parameter digest, sender and recipient. ``U2`` = senders.
2. *MaskedInput* — the server sends ``U2``; ``u`` sends ``y_u = x_u + PRG(b_u) +
   sum_{v in U2, v != u} sign(u, v) PRG(s_uv)`` in ``Z_2^64``, where ``s_uv`` is
   HKDF-SHA256 of ``X25519(s_u, s_v)`` bound to session, round and digest
   (:func:`flwr_fsl.crypto.channel.agree_key`), ``PRG`` is AES-128-CTR with the zero nonce
   (:func:`flwr_fsl.crypto.prg.ctr_stream`, or :func:`~flwr_fsl.crypto.prg.ctr_words` at given
   positions) and ``sign(u, v) = +1`` if ``u < v`` else ``-1``. ``U3`` = senders.
3. *Unmask* — the server sends every ``u in U3`` the set ``U3`` and the sealed shares addressed
   to ``u``; ``u`` checks ``U3 ⊆ U2``, ``u in U3``, ``|U3| >= t``, opens the shares and returns,
   for each ``v in U3``, its share of ``b_v`` and, for each ``v in U2 \ U3`` (dropped after
   sharing), its share of ``s_v``'s private key — never both for one ``v``. With ``t`` shares
   of each, the server removes ``PRG(b_u)`` for the survivors and the pair masks the survivors
   still hold with the dropped clients: ``sum_{u in U3} y_u - ... = sum_{u in U3} x_u``.

**Threat model and leakage.** Honest-but-curious server and clients; the server may collude
with fewer than ``t`` clients. The server learns ``sum_{u in U3} x_u``, the sets ``U1..U4``
and message sizes; a client learns the roster's public keys and ``U2``, ``U3``. Each ``y_u``
alone is uniform in ``Z_2^64`` given the server's view while some other client of ``U3`` is
honest (``tests/families/secagg/test_protocol.py``). Not covered (Bonawitz's semi-honest
variant): a *deviating* server can tell some clients that ``v`` dropped and others that it
survived and so collect both of ``v``'s secrets; no signatures or consistency round.
**Faulty clients** (``docs/families/secagg.md``): masks are fresh per round (new keys, new
``b_u``, pair keys bound to session, round and digest), so a masked input replayed from another
round never cancels and the decoded sum breaks its plausibility bounds (the strategy's decode);
a share that does not open is skipped by its recipient and blamed on its sender; shares off
the polynomial blame their holder when it broke several secrets, else fail naming both.

**SecAgg+** (``neighbours = k``): "others" above are ``k`` neighbours (:mod:`.graph`, bounds).

**Wire formats**: :mod:`flwr_fsl.families.secagg.messages` (all little-endian, version 1, each
decoder checks every length first and raises :class:`SecAggError`). **In-process round**:
:func:`run_round` and :class:`RoundOutcome` live in :mod:`flwr_fsl.families.secagg.rounds`
(re-exported here).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import (
    ClientInputError,
    RoundFailedError,
    TooFewSurvivorsError,
)
from flwr_fsl.crypto.channel import (
    KEY_BYTES,
    SealedBoxError,
    SealingKeyPair,
    client_party,
)
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.sealing import open_from, seal_for
from flwr_fsl.families.secagg.attribution import find_liar
from flwr_fsl.families.secagg.masks import (
    _limbs,
    _shamir,
    _unlimbs,
    add_streams,
    pair_key,
    pair_mask,
    self_mask,
)
from flwr_fsl.families.secagg.messages import (
    _KIND_KEY,
    _KIND_SEED,
    _SEED_BYTES,
    _SEED_LIMBS,
    _SK_LIMBS,
    _SPARSE_SUBSET,
    MAX_CLIENTS,
    MAX_VECTOR_LENGTH,
    SEALED_SHARE_BYTES,
    SHARE_PLAINTEXT_BYTES,
    MaskedWords,
    SecAggError,
    SecAggParams,
    UnmaskRequest,
    _check_id,
    _check_rows,
    _entries_from_bytes,
    _entries_to_bytes,
    _graph,
    _public,
    _repeats,
    _roster_from_bytes,  # noqa: F401 (re-exported: tests/test_frozen_vectors.py)
    _roster_index,
    _roster_to_bytes,
    _State,
    _state_from_bytes,
    _state_to_bytes,
    _unmask_reply_from_bytes,
    _unmask_reply_to_bytes,
    decode_ids,
    decode_rows,
    encode_ids,
    encode_rows,
)
from flwr_fsl.families.secagg.replay import ReplayGuard, fingerprint

__all__ = [
    "DROPOUT_PHASES",
    "MAX_CLIENTS",
    "MAX_VECTOR_LENGTH",
    "MaskedWords",
    "RoundOutcome",
    "SecAggClient",
    "SecAggError",
    "SecAggParams",
    "SecAggServer",
    "TooFewSurvivorsError",
    "UnmaskRequest",
    "decode_ids",
    "decode_rows",
    "encode_ids",
    "encode_rows",
    "run_round",
]

_U64 = np.uint64
SHARE_PURPOSE = "secagg-share"
"""Purpose of a sealed Shamir share (:func:`~flwr_fsl.crypto.sealing.seal_for`)."""


# ---------------------------------------------------------------------------------- helpers


# ---------------------------------------------------------------------------------- client


@dataclass
class SecAggClient:
    """One client's side of a round; its state survives between messages (:meth:`to_bytes`).

    Parameters
    ----------
    node : int
        This client's id (the Flower node id).
    params : SecAggParams
        The round.
    """

    node: int
    params: SecAggParams
    c_key: SealingKeyPair = field(default_factory=SealingKeyPair.generate, repr=False)
    s_key: SealingKeyPair = field(default_factory=SealingKeyPair.generate, repr=False)
    seed: bytes = field(default_factory=lambda: os.urandom(_SEED_BYTES), repr=False)
    roster: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    sharers: tuple[int, ...] = ()
    own_share: NDArray[np.uint64] | None = field(default=None, repr=False)
    unmasked: bool = False
    _hood: frozenset[int] | None = field(default=None, repr=False, compare=False)

    def advertise(self) -> bytes:
        """Round 0: ``c_pk || s_pk`` (64 bytes)."""
        return self.c_key.public_bytes + self.s_key.public_bytes

    def neighbours(self) -> frozenset[int]:
        """``N(u)``: whom it masks with and shares to (the roster's hash, never the server's)."""
        if self._hood is None and self.roster:  # the roster kept is the neighbourhood
            self._hood = frozenset(self.roster) - {self.node}
        return self._hood or frozenset()

    def share_keys(self, roster: bytes) -> bytes:
        """Round 1: check the roster and return the sealed shares for everyone else in it.

        Parameters
        ----------
        roster : bytes
            ``U1`` with its public keys (:meth:`SecAggServer.roster`).

        Returns
        -------
        bytes
            Recipient -> sealed share, in the entries format.

        Raises
        ------
        SecAggError
            If the roster is malformed, lacks this client or its exact keys, repeats a key,
            or has fewer than ``t`` clients.
        """
        if self.roster:
            raise SecAggError("the shares were already made for this round")
        order, at, keys = _roster_index(roster)  # ids, id -> row, (n, 64) key bytes
        mine = self.c_key.public_bytes + self.s_key.public_bytes
        if self.node not in at or keys[at[self.node]].tobytes() != mine:
            raise SecAggError("the roster does not hold this client's own public keys")
        if _repeats(keys):
            raise SecAggError("the roster repeats a public key")
        if len(order) < self.params.threshold:
            raise SecAggError(
                f"the roster has fewer clients than the threshold t = {self.params.threshold}"
            )
        near = self._hood = _graph(self.params, order, roster)[self.node]
        entries = {  # only the neighbourhood's keys are ever used (and kept)
            v: (keys[at[v], :KEY_BYTES].tobytes(), keys[at[v], KEY_BYTES:].tobytes())
            for v in sorted(near | {self.node})
        }
        if len(near) + 1 < self.params.threshold:
            raise SecAggError("this client has fewer neighbours than the threshold allows")
        scheme = _shamir(self.params, len(order))
        secrets = np.concatenate(
            [
                _limbs(self.s_key.private_bytes(), _SK_LIMBS),
                _limbs(self.seed, _SEED_LIMBS),
            ]
        )
        shares = scheme.share(secrets, PRGStream.fresh())
        sealed: dict[int, bytes] = {}
        for position, peer in enumerate(order):
            if peer not in near:  # SecAgg+: shares go to N(u) only (all others by default)
                continue
            plaintext = (
                struct.pack("<QQ", self.node, peer) + shares[position].astype("<u4").tobytes()
            )
            sealed[peer] = seal_for(
                entries[peer][0],
                plaintext,
                purpose=SHARE_PURPOSE,
                binding=self.params.binding,
                sender=client_party(self.node),
                recipient=client_party(peer),
            )
        self.roster = entries  # the neighbourhood's keys (everyone's for the complete graph)
        # The share a client keeps for itself is also needed in Unmask.
        self.own_share = shares[at[self.node]].copy()
        return _entries_to_bytes(sealed, SEALED_SHARE_BYTES)

    def masked_input(  # noqa: C901
        self,
        sharers: Sequence[int],
        vector: NDArray[np.uint64],
        *,
        rows: NDArray[np.int64] | None = None,
        shared_rows: Mapping[int, NDArray[np.int64]] | None = None,
    ) -> NDArray[np.uint64]:
        """Round 2: ``y_u = x_u + PRG(b_u) + sum_v sign(u, v) PRG(s_uv)`` over ``v in U2``.

        **Subset rounds** (Niu et al. Alg. 1 line 8: each position is aggregated over the
        clients that hold it): with ``rows``, the client contributes only at the positions
        ``R_u`` (``vector`` has ``len(rows)`` words), its self mask is ``PRG(b_u)`` at ``R_u``
        and its pair mask with ``v`` covers ``R_u ∩ R_v`` only, given by the server in
        ``shared_rows`` (the participants of each of its positions, nothing more of ``R_v``).

        Parameters
        ----------
        sharers : sequence of int
            ``U2``, the clients whose shares the server relays (a subset of the roster).
        vector : numpy.ndarray
            ``x_u``: ``vector_length`` uint64 ring words, or ``len(rows)`` in a subset round.
        rows : numpy.ndarray, optional
            ``R_u``, strictly increasing positions in ``[0, vector_length)``.
        shared_rows : Mapping[int, numpy.ndarray], optional
            Peer ``v`` -> ``R_u ∩ R_v`` (peers absent share no position).

        Returns
        -------
        numpy.ndarray
            ``y_u`` (of the vector's length).

        Raises
        ------
        SecAggError
            If ``U2`` is not a subset of the roster holding this client, is smaller than ``t``,
            the vector has the wrong shape or type, or the row sets are inconsistent.
        """
        u2 = sorted({_check_id(v) for v in sharers})
        if not self.roster or self.own_share is None:
            raise SecAggError("masked input asked before the shares were made")
        if self.sharers:
            # A second y_u under another U2 would differ from the first by pair masks.
            raise SecAggError("masked input was already sent for this round")
        complete = self.params.neighbours is None  # else only neighbours' ids are known
        if self.node not in u2 or (complete and not set(u2) <= set(self.roster)):
            raise SecAggError("U2 must hold this client and lie in the roster")
        near = self.neighbours()
        if len(({self.node} | near) & set(u2)) < self.params.threshold:
            raise SecAggError(
                f"U2 holds fewer than the threshold t = {self.params.threshold} of this "
                "client's neighbourhood"
            )
        length = self.params.vector_length
        mine = None if rows is None else _check_rows(rows, length, "this client's rows")
        if mine is not None and not complete:
            raise SecAggError(_SPARSE_SUBSET)
        shared = dict(shared_rows or {})
        if mine is None and shared:
            raise SecAggError("shared rows given for a full-vector round")
        if not set(shared) <= set(u2) & near:
            raise SecAggError("shared rows name a client outside U2 or not a neighbour")
        x = np.asarray(vector)
        size = length if mine is None else mine.size
        if x.dtype != _U64 or x.shape != (size,):
            raise SecAggError(f"the vector must be {size} uint64 words")
        private = self.s_key.private_key
        peers = [v for v in u2 if v in near]  # SecAgg+: pair masks with neighbours only
        if mine is None:  # full vector: every mask added chunk by chunk (masks.add_streams)
            y = x.copy()
            add_streams(y, [(self.seed, False)] + [
                (pair_key(self.params, private, self.roster[v][1], *sorted((self.node, v))),
                 v < self.node) for v in peers])  # fmt: skip
            self.sharers = tuple(u2)
            return y
        y = x + self_mask(self.params, self.seed, mine)
        for v in peers:
            low, high = min(self.node, v), max(self.node, v)
            positions = _check_rows(shared.get(v, np.zeros(0, np.int64)), length, "rows")
            where = np.searchsorted(mine, positions)
            if positions.size and not np.array_equal(
                mine[np.minimum(where, mine.size - 1)], positions
            ):
                raise SecAggError("shared rows are not a subset of this client's rows")
            mask = pair_mask(self.params, private, self.roster[v][1], low, high, positions)
            if self.node < v:
                y[where] += mask
            else:
                y[where] -= mask
        self.sharers = tuple(u2)
        return y

    def unmask(self, request: bytes) -> bytes:  # noqa: C901
        """Round 3: this client's shares of ``b_v`` (``v in U3``) and of ``s_v`` (dropped).

        Parameters
        ----------
        request : bytes
            :class:`UnmaskRequest` bytes.

        Returns
        -------
        bytes
            Entries ``v -> kind (u8: 0 seed, 1 key) || share (u32 limbs)``.

        Raises
        ------
        SecAggError
            If the request is malformed, ``U3`` is not a subset of ``U2`` holding this client
            or is smaller than ``t``.
        """
        req = UnmaskRequest.from_bytes(request)
        u3 = set(req.survivors)
        if not self.sharers or self.own_share is None:
            raise SecAggError("unmask asked before the masked input was sent")
        if self.unmasked:
            # A second request with another U3 could collect both secrets of one client.
            raise SecAggError("unmask was already answered for this round")
        if self.node not in u3 or not u3 <= set(self.sharers):
            raise SecAggError("U3 must hold this client and lie in U2")
        near = self.neighbours()
        if len(({self.node} | near) & u3) < self.params.threshold:
            # Else too few of its pair masks stay in the sum: b_u alone would unmask x_u.
            raise SecAggError(
                f"U3 holds fewer than the threshold t = {self.params.threshold} of this "
                "client's neighbourhood"
            )
        if not set(req.sealed_shares) <= set(self.sharers) & near:
            raise SecAggError("a relayed share comes from a client outside U2 or its neighbours")
        self.unmasked = True
        shares: dict[int, NDArray[np.uint64]] = {self.node: self.own_share}
        binding = self.params.binding
        for sender, blob in req.sealed_shares.items():
            try:
                plain = open_from(
                    self.c_key,
                    blob,
                    purpose=SHARE_PURPOSE,
                    binding=binding,
                    sender=client_party(sender),
                    recipient=client_party(self.node),
                )
            except SealedBoxError:
                continue  # the sender (or the relay) is at fault: contribute no share of it
            if len(plain) != SHARE_PLAINTEXT_BYTES or struct.unpack_from("<QQ", plain) != (
                sender,
                self.node,
            ):
                continue
            shares[sender] = np.frombuffer(plain, dtype="<u4", offset=16).astype(_U64)
        out: dict[int, bytes] = {}
        for v in self.sharers:
            if v not in shares:
                continue
            # Never both secrets of one client: b_v if v survived, s_v's key if it dropped.
            if v in u3:
                out[v] = bytes([_KIND_SEED]) + shares[v][_SK_LIMBS:].astype("<u4").tobytes()
            else:
                out[v] = bytes([_KIND_KEY]) + shares[v][:_SK_LIMBS].astype("<u4").tobytes()
        return _unmask_reply_to_bytes(out)

    # -- state between messages ---------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Return this client's secret state (keys, seed, roster, ``U2``, own share) as bytes.

        It never leaves the client (``Context.state``); the ``FSAC`` format is
        :func:`~flwr_fsl.families.secagg.messages._state_to_bytes`.
        """
        return _state_to_bytes(
            _State(
                self.node,
                self.c_key.private_bytes(),
                self.s_key.private_bytes(),
                self.seed,
                self.params,
                self.roster,
                self.sharers,
                self.own_share,
                self.unmasked,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SecAggClient:
        """Strict decoder of :meth:`to_bytes` (raises :class:`SecAggError`)."""
        st = _state_from_bytes(data)
        try:
            c_key = SealingKeyPair.from_private_bytes(st.c_private)
            s_key = SealingKeyPair.from_private_bytes(st.s_private)
        except ValueError as err:
            raise SecAggError("SecAgg client state holds a bad key") from err
        return cls(
            st.node,
            st.params,
            c_key,
            s_key,
            st.seed,
            st.roster,
            st.sharers,
            st.own_share,
            st.unmasked,
        )


# ---------------------------------------------------------------------------------- server


@dataclass
class SecAggServer:
    """The server's side of one round: collects each step, relays, reconstructs the sum.

    Call in order: :meth:`add_advertisement` per client, :meth:`roster`,
    :meth:`add_shares` per client, :meth:`sharers`, :meth:`add_masked_input` per client,
    :meth:`unmask_request` per survivor, :meth:`add_unmask` per survivor, :meth:`result`.
    A client whose message is malformed raises :class:`SecAggError` and is simply not added
    (it counts as dropped at that step).

    Parameters
    ----------
    params : SecAggParams
        The round.
    guard : ReplayGuard, optional
        The strategy's memory of earlier rounds' replies: a repeat is refused (the client
        dropped) before it is used (:mod:`flwr_fsl.families.secagg.replay`).
    """

    params: SecAggParams
    guard: ReplayGuard | None = None
    _keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    _roster: dict[int, tuple[bytes, bytes]] | None = None
    _near: Mapping[int, frozenset[int]] = field(default_factory=dict)
    _raw: bytes = b""  # the roster's bytes
    _dealt: set[int] = field(default_factory=set)  # whose share bundle was taken
    _dealt_unmask: set[int] = field(default_factory=set)  # whose unmask reply was taken
    _mailbox: dict[int, dict[int, bytes]] = field(default_factory=dict)
    _sharers: tuple[int, ...] | None = None
    _sum: NDArray[np.uint64] | None = None
    _survivors: set[int] = field(default_factory=set)
    _shares: dict[int, dict[int, NDArray[np.uint64]]] = field(default_factory=dict)
    _rows: dict[int, NDArray[np.int64]] | None = None
    excluded: dict[int, str] = field(default_factory=dict)  # Unmask liars (attribution.py)

    def add_advertisement(self, node: int, advertisement: bytes) -> None:
        """Round 0: take a client's two public keys (raises :class:`SecAggError`)."""
        node = _check_id(node)
        if self._roster is not None:
            raise SecAggError("advertisement after the roster was sent")
        if not isinstance(advertisement, bytes) or len(advertisement) != 2 * KEY_BYTES:
            raise SecAggError(f"an advertisement must be {2 * KEY_BYTES} bytes")
        c_pk, s_pk = advertisement[:KEY_BYTES], advertisement[KEY_BYTES:]
        _public(c_pk), _public(s_pk)
        seen = {k for pair in self._keys.values() for k in pair}
        if c_pk == s_pk or c_pk in seen or s_pk in seen or node in self._keys:
            raise SecAggError("an advertisement repeats a public key or a client")
        self._fresh("advertisement", advertisement)
        self._keys[node] = (c_pk, s_pk)

    def roster(self) -> bytes:
        """Close round 0 and return ``U1`` with its keys (the same bytes for every client).

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``t`` clients advertised.
        """
        if self._roster is None:
            self._need(len(self._keys), "advertised keys")
            self._roster = dict(sorted(self._keys.items()))
            self._raw = _roster_to_bytes(self._roster)
            self._near = _graph(self.params, self._roster, self._raw)
        return self._raw

    @property
    def graph(self) -> Mapping[int, frozenset[int]]:
        """The round's mask graph, ``u -> N(u)`` (empty before :meth:`roster`)."""
        return self._near

    def add_shares(self, node: int, bundle: bytes) -> None:
        """Round 1: take a client's sealed shares, one for every other roster member.

        Raises
        ------
        SecAggError
            If the bundle is malformed or does not address exactly the other roster members.
        """
        if self._roster is None or self._sharers is not None:
            raise SecAggError("shares outside the ShareKeys round")
        node = _check_id(node)
        if node not in self._roster or node in self._dealt:
            raise SecAggError("shares from a client outside the roster, or twice")
        sealed = _entries_from_bytes(bundle, SEALED_SHARE_BYTES, "share bundle")
        if set(sealed) != self._near[node]:
            raise SecAggError("a share bundle must address each of the client's neighbours once")
        self._fresh("share bundle", bundle)
        self._dealt.add(node)
        for recipient, blob in sealed.items():
            self._mailbox.setdefault(recipient, {})[node] = blob

    def sharers(self, among: Collection[int] | None = None) -> tuple[int, ...]:
        """Close round 1 and return ``U2``, the clients whose shares were all received.

        Parameters
        ----------
        among : Collection[int], optional
            When closing: the clients still in the round (the round engine's survivors); the
            shares of any other sender (e.g. one dropped after its shares were taken) are
            discarded, so ``U2`` never holds a client the round dropped.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``t`` clients shared.
        """
        if self._sharers is None:
            if self._roster is None:
                raise RoundFailedError("sharers asked before the roster")
            if among is not None:
                keep = set(among)
                for box in self._mailbox.values():
                    for sender in [s for s in box if s not in keep]:
                        del box[sender]
            senders = {s for box in self._mailbox.values() for s in box}
            self._need(len(senders), "clients that shared their keys")
            self._sharers = tuple(sorted(senders))
        return self._sharers

    def assign_rows(
        self, rows: Mapping[int, NDArray[np.int64]]
    ) -> dict[int, dict[int, NDArray[np.int64]]]:
        """Make this a subset round: client ``u in U2`` contributes at positions ``R_u`` only.

        Parameters
        ----------
        rows : Mapping[int, numpy.ndarray]
            ``u -> R_u`` for every ``u in U2`` (strictly increasing positions).

        Returns
        -------
        dict
            ``u -> {v: R_u ∩ R_v}`` (non-empty intersections only): what each client gets
            with its masked-input request.

        Raises
        ------
        SecAggError
            If the rows do not cover exactly ``U2``, are malformed, or are assigned twice.
        """
        u2 = self.sharers()
        if self._rows is not None or self._survivors:
            raise SecAggError("rows assigned twice or after masked inputs")
        if set(rows) != set(u2):
            raise SecAggError("rows must be assigned to exactly the clients of U2")
        if self.params.neighbours is not None:
            raise SecAggError(_SPARSE_SUBSET)
        length = self.params.vector_length
        checked = {u: _check_rows(r, length, "assigned rows") for u, r in rows.items()}
        self._rows = checked
        shared: dict[int, dict[int, NDArray[np.int64]]] = {u: {} for u in checked}
        order = sorted(checked)
        for a, u in enumerate(order):
            for v in order[a + 1 :]:
                if v not in self._near[u]:
                    continue  # SecAgg+: no pair mask between non-neighbours
                both = np.intersect1d(checked[u], checked[v], assume_unique=True)
                if both.size:
                    shared[u][v] = both
                    shared[v][u] = both
        return shared

    def rows_of(self, node: int) -> NDArray[np.int64] | None:
        """``R_u`` of a subset round (None in a full-vector round or for another client)."""
        return None if self._rows is None else self._rows.get(node)

    def participants(self) -> NDArray[np.int64]:
        """How many survivors contributed at each position (all of ``U3`` in a full round)."""
        counts = np.zeros(self.params.vector_length, dtype=np.int64)
        for u in self._survivors:
            if self._rows is None:
                counts += 1
            else:
                counts[self._rows[u]] += 1
        return counts

    def add_masked_input(self, node: int, masked: NDArray[np.uint64] | MaskedWords) -> None:
        """Round 2: add a client's ``y_u`` to the running sum (raises :class:`SecAggError`).

        ``masked`` is the vector, or a reply that yields its words only once told how many are
        expected (:class:`MaskedWords`): a reply of another size is refused before its bytes
        are parsed, so a client cannot make the server copy more than a round's vector.
        """
        u2 = self.sharers()
        node = _check_id(node)
        if node not in u2 or node in self._survivors:
            raise SecAggError("masked input from a client outside U2, or twice")
        rows = None if self._rows is None else self._rows[node]
        size = self.params.vector_length if rows is None else rows.size
        y = masked.words(size) if isinstance(masked, MaskedWords) else np.asarray(masked)
        if y.dtype != _U64 or y.shape != (size,):
            raise SecAggError(f"a masked input must be {size} uint64 words")
        self._fresh("masked input", fingerprint(y))
        if self._sum is None:
            self._sum = np.zeros(self.params.vector_length, dtype=_U64)
        if rows is None:
            self._sum += y
        else:
            self._sum[rows] += y
        self._survivors.add(node)

    @property
    def survivors(self) -> tuple[int, ...]:
        """``U3``: the clients whose masked input is in the sum."""
        return tuple(sorted(self._survivors))

    def check_survivors(self, kept: Collection[int]) -> None:
        """Raise RoundFailedError if a client of ``U3`` (in the sum) is not in ``kept``.

        A node dropped after its input was added (a stale reply, then a second one) left an
        input in the sum that the round no longer counts: it cannot be taken out.
        """
        if extra := sorted(self._survivors - set(kept)):
            raise RoundFailedError(
                f"the masked input of {extra} is in the sum but the round dropped the client "
                "afterwards (a second reply): the sum cannot be used"
            )

    def unmask_request(self, node: int) -> bytes:
        """Round 3: ``U3`` and the sealed shares addressed to ``node`` from ``U2``.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``t`` clients sent masked input.
        """
        self._need(len(self._survivors), "masked inputs")
        u2 = set(self.sharers())
        box = {s: b for s, b in self._mailbox.get(node, {}).items() if s in u2}
        return UnmaskRequest(self.survivors, box).to_bytes()

    def add_unmask(self, node: int, reply: bytes) -> None:
        """Round 3: take a survivor's shares (raises :class:`SecAggError`)."""
        node = _check_id(node)
        if node not in self._survivors or node in self._dealt_unmask:
            raise SecAggError("unmask reply from a client outside U3, or twice")
        entries = _unmask_reply_from_bytes(reply)
        self._fresh("unmask reply", reply)
        self._dealt_unmask.add(node)
        u2 = set(self.sharers())
        for v, (kind, _share) in entries.items():
            expected = _KIND_SEED if v in self._survivors else _KIND_KEY
            if v not in u2 or kind != expected or (v != node and v not in self._near[node]):
                raise SecAggError("unmask reply holds a share the server did not ask for")
        for v, entry in entries.items():
            self._shares.setdefault(v, {})[node] = entry[1]

    def result(self) -> NDArray[np.uint64]:  # noqa: C901
        """Reconstruct the secrets and return ``sum_{u in U3} x_u`` in ``Z_2^64``.

        Raises
        ------
        TooFewSurvivorsError
            If a secret has fewer than ``t`` shares (too many survivors dropped in Unmask).
        RoundFailedError
            If shares are inconsistent (a deviating client) or a recovered key is unusable.
        """
        self._need(len(self._survivors), "masked inputs")
        assert self._sum is not None and self._roster is not None
        order = sorted(self._roster)
        scheme = _shamir(self.params, len(order))
        total = self._sum.copy()
        u2 = self.sharers()
        liar = find_liar(scheme, order, self._shares)
        if liar is not None:  # one holder's shares break several secrets: ignore them
            for box in self._shares.values():
                box.pop(liar, None)
            self.excluded[liar] = "its Unmask shares are off the polynomial of several secrets"
        index = {p: i for i, p in enumerate(order)}
        streams: list[tuple[bytes, bool]] = []  # full round: (key, subtract), added at the end
        for v in u2:
            holders = self._shares.get(v, {})
            if len(holders) < self.params.threshold:
                raise TooFewSurvivorsError(self._short_reason(v, holders))
            parties = sorted(holders)
            try:
                secret = scheme.reconstruct(
                    [index[p] for p in parties], [holders[p] for p in parties]
                )
            except ClientInputError as err:
                raise RoundFailedError(
                    f"SecAgg unmask failed for client {v}'s secret: {err}; either {v} dealt "
                    f"inconsistent shares or one of its holders {parties} returned a wrong one "
                    "(the server cannot tell which)"
                ) from err
            if v in self._survivors:
                if self._rows is None:
                    streams.append((_unlimbs(secret, _SEED_BYTES), True))
                else:
                    seed = _unlimbs(secret, _SEED_BYTES)
                    total[self._rows[v]] -= self_mask(self.params, seed, self._rows[v])
                continue
            try:
                dropped = SealingKeyPair.from_private_bytes(_unlimbs(secret, KEY_BYTES))
            except ValueError as err:
                raise RoundFailedError("a reconstructed mask key is not a key") from err
            if dropped.public_bytes != self._roster[v][1]:
                raise RoundFailedError("a reconstructed mask key does not match its public key")
            for u in self._survivors & self._near[v]:
                # u holds sign(u, v) PRG(s_uv) for the dropped v: remove it.
                low, high = min(u, v), max(u, v)
                try:
                    key = pair_key(self.params, dropped.private_key, self._roster[u][1], low, high)
                except SecAggError as err:
                    raise RoundFailedError(str(err)) from err
                if self._rows is None:
                    streams.append((key, u < v))
                    continue
                where = np.intersect1d(self._rows[u], self._rows[v], assume_unique=True)
                mask = self_mask(self.params, key, where)  # PRG(s_uv) at those positions
                if u < v:
                    total[where] -= mask
                else:
                    total[where] += mask
        add_streams(total, streams)
        return total

    def _short_reason(self, v: int, holders: Mapping[int, object]) -> str:
        """Why ``v``'s secret lacks shares; a holder that skipped ``v``'s share blames ``v``."""
        refused = sorted({h for box in self._shares.values() for h in box} - set(holders) - {v})
        text = f"{len(holders)} shares of client {v}'s secret, the threshold is t = "
        text += str(self.params.threshold)
        if refused:
            text += (
                f"; client {v}'s sealed shares did not open for {refused} (client {v} sent "
                "shares that do not open, or the relay changed them)"
            )
        return text

    def _fresh(self, what: str, data: bytes) -> None:
        if self.guard is not None:
            self.guard.check(self.params.session, self.params.round_id, what, data)

    def _need(self, count: int, what: str) -> None:
        if count < self.params.threshold:
            raise TooFewSurvivorsError(
                f"{count} {what}, fewer than the threshold t = {self.params.threshold}"
            )


# Re-exported from the module that holds them (imported last: the driver uses the parties above).
from flwr_fsl.families.secagg.rounds import DROPOUT_PHASES, RoundOutcome, run_round  # noqa: E402
