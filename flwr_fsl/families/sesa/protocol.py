r"""SESA: Lagrange-coded secure submodel aggregation (Sami & Güler, §IV), one server, N clients.

Flower-free: :class:`SesaClient` and :class:`SesaServer` exchange bytes;
:mod:`flwr_fsl.families.sesa.strategy` and :mod:`flwr_fsl.families.sesa.mod` carry them in Flower
messages. Clients never talk to each other: what client ``i`` sends client ``j`` is sealed to ``j``
(:func:`flwr_fsl.crypto.sealing.seal_for`, HPKE X25519 / AES-256-GCM from
``cryptography``) and relayed by the server. Arithmetic is in ``F_p``, ``p = 2^32 - 5``
(:class:`~flwr_fsl.crypto.ring.PrimeField`; any prime below 2^32 for tests), vectorized over
the shard vector with the numba field kernels (:mod:`flwr_fsl.kernels.field`).

**What is aggregated.** The model's shardable part is split into ``K`` *shards* of equal
length ``d`` (one slice of hidden nodes: its incoming weights and biases and its outgoing
weights). Client ``i`` picks ``K_i`` shards (its capacity) uniformly at random, without
replacement, and its update of shard ``k`` is a vector ``ḡ_ik ∈ F_p^d``. The server learns, for
every shard ``n``, the sum ``Σ_{i ∈ U3, n ∈ 𝒦_i} ḡ_in`` over the surviving clients that chose it
(eq. 28) — and nothing about which shards an honest client chose. Several independent
*groups* can run side by side in one round (:class:`SesaGroup`, each with its own ``K``, ``d``
and fresh randomness, as the paper runs one instance per layer pair).

**Parameters** (:class:`SesaParams`): ``T >= 1`` colluding clients tolerated; per group ``K``
shards of ``d`` words. Public points: ``β_n = n`` for ``n = 1..K+T`` (per group) and, for the
client at position ``q`` of the roster (sorted ids), ``α_q = K_max + T + 1 + q``: all
``N + K + T`` points are distinct as long as ``K_max + T + N < p`` (checked).
Write ``L_n(z) = Π_{n' ≠ n} (z - β_{n'}) / (β_n - β_{n'})`` for the Lagrange basis through
``β_1..β_{K+T}``.

**Rounds.**

0. *Advertise* — client ``i`` draws an X25519 key pair and sends its public key. ``U1``.
1. *Offline* (eqs. 20–22) — the server sends the roster ``U1`` with the keys. Client ``i``
   draws a 16-byte seed; per group an AES-CTR stream of that seed gives, for each of its
   slots ``k = 1..K_i`` (slot ``k`` holds shard ``s_k``, the slots in increasing shard order),
   a mask ``r_ik ∈ F_p^d``, ``T`` scalars ``u_ikn`` and ``T`` vectors ``v_ikn ∈ F_p^d``
   (``n = K+1..K+T``), all uniform. The *selector* ``ϕ_ik(z) = L_{s_k}(z) + Σ_n u_ikn L_n(z)``
   is the polynomial of degree ``K+T-1`` with ``ϕ_ik(β_n) = b_ik(n)`` (1 at the chosen shard, 0
   at the others, eq. 20) and ``u_ikn`` at the ``T`` extra points (eq. 21); the *mask
   polynomial* ``φ_ik(z) = r_ik L_{s_k}(z) + Σ_n v_ikn L_n(z)`` has ``b_ik(n) r_ik`` at
   ``β_1..β_K`` (eq. 22). Client ``i`` sends client ``j`` the evaluations
   ``{ϕ_ik(α_j), φ_ik(α_j)}_k``, sealed to ``j``; it keeps nothing but the seed and its shard
   choice (its own evaluation is recomputed later). ``U2`` = clients whose bundle arrived.
2. *Online* (eq. 23) — the server sends ``U2``; client ``i`` trains and sends the masked
   updates ``x_ik = ḡ_{i,s_k} - r_ik`` of its ``K_i`` slots. ``U3`` = senders.
3. *Evaluate* (eq. 24) — the server sends client ``i ∈ U3`` the set ``U3``, every
   ``x_jk`` (``j ∈ U3``) and the sealed evaluations addressed to ``i`` by ``U3``. Client ``i``
   returns ``ψ(α_i) = Σ_{j ∈ U3} Σ_k (x_jk ϕ_jk(α_i) + φ_jk(α_i))`` (one vector of ``d`` words
   per group). ``U4`` = senders.
4. *Decode* (eqs. 25–28) — ``ψ(z) = Σ_{j,k} (x_jk ϕ_jk(z) + φ_jk(z))`` has degree ``K+T-1``
   and at ``β_n`` (``n ≤ K``) equals ``Σ_{j,k} b_jk(n) (x_jk + r_jk) = Σ_{j ∈ U3 : n ∈ 𝒦_j} ḡ_jn``.
   From any ``K + T`` evaluations the server interpolates it at ``β_1..β_K``; evaluations
   beyond ``K + T`` are checked to lie on the same polynomial (a deviating client fails the
   round rather than corrupting the model silently; it cannot be attributed).

**Dropouts** (Theorem 3). A client lost before its bundle arrived is not in ``U2``: the
evaluations others sealed to it are never used. A client lost after the offline phase but
before sending ``x`` (``U2 \ U3``) contributes nothing: every survivor leaves its terms out
of ``ψ``, so it is as if it had never chosen shards. A client lost after sending ``x`` but
before ``ψ(α_i)`` (``U3 \ U4``) *is* aggregated — the other survivors hold its evaluations —
and only its own evaluation of ``ψ`` is missing. Decoding needs ``|U4| ≥ K_max + T``, so up to
``D = N - (K_max + T)`` clients may drop in all; with fewer left at any step the round fails
with :class:`TooFewSurvivorsError` (a :class:`~flwr_fsl.core.errors.RoundFailedError`). Clients
also refuse a ``U2`` or ``U3`` smaller than ``K_max + T``.

**Threat model and leakage** (Theorem 4). Honest-but-curious server and clients; the server
may collude with up to ``T`` clients. What a coalition ``𝒯`` of ``T`` clients receives from an
honest client ``h`` is ``{ϕ_hk(α_t), φ_hk(α_t)}_{t ∈ 𝒯}`` and, with the server, ``x_hk``:

* the ``T`` selector evaluations are uniform whatever ``h`` chose: the map
  ``(u_{K+1..K+T}) -> (ϕ(α_t))_{t∈𝒯}`` is ``u -> c + M u`` with
  ``M[t, n] = L_{K+n}(α_t)``, and ``M`` is invertible (a polynomial of degree ``< K+T``
  vanishing at ``β_1..β_K`` and at the ``T`` points ``α_t`` is zero) — so it is a bijection of
  ``F_p^T`` for every choice;
* the mask evaluations are uniform and independent of ``r_hk`` by the same argument on
  ``v``, and ``x_hk = ḡ - r_hk`` is uniform and independent of ``ḡ`` because ``r_hk`` is;
* ``ψ``, which the server decodes entirely, is determined by the per-shard sums (its values at
  ``β_1..β_K``) and by the coalition's own evaluations of the honest clients' terms, so it
  adds nothing beyond the aggregate.

``tests/families/sesa/test_protocol.py`` checks the first exactly (a small field, every ``u``), and
statistically at ``p = 2^32 - 5`` for the coalition's whole view of two different choices, and
that the server's ``x`` are uniform. **What the server learns, by design:** per shard the sum
of its contributors' vectors — with the count word of :class:`ShardVector`, the total weight
of the clients that chose it (their number at the strategy's default unit weights), which is
part of the aggregate: the server divides by it (the platform's count-weighted average, Niu
App. C) and knows it. Per-client weights fixed across rounds would let it decode who chose
which shard (``tests/attacks/test_sesa_weights_subset_sum.py``). So **a shard that exactly one
surviving client chose reveals that client's update of it** (and its weight), and a shard
nobody chose is visible as such; both are properties of the per-shard aggregate the paper
releases, not of the coding (shown in the tests). The server also learns ``U1..U4`` and each
client's number of shards ``K_i`` (from message sizes), not which ones. Clients learn the
roster's public keys, ``U2``, ``U3`` and every ``x`` (uniform). Not defended: a server that
deviates (e.g. sends different ``U3`` to different clients; clients only refuse a ``U3`` that
is not a subset of ``U2`` holding themselves or is too small), and malicious clients, which can
add to any shard's sum (a selector that is not a unit vector at the ``β``) — what one can do is
bounded by :mod:`~flwr_fsl.families.sesa.attribution` (complaints, bounds, round binding).

**Dimension choices** (the paper leaves them loose):

* ``r_ik``, ``v_ikn``, ``x_ik`` and ``ψ`` all have the shard length ``d``: eq. 23 subtracts
  ``r_ik`` from a shard update ``ḡ ∈ F_p^{d'/K}``, so the paper's ``r ∈ F_p^{d'}`` must be read
  as ``d'/K``.
* One group per sharded layer pair. For a one-hidden-layer MLP (784-200-10) with the input and
  output layers kept whole, a shard is ``d = 200/K`` hidden nodes with their 784 input weights,
  bias and 10 output weights, and ``K = 1/B_min`` (not ``1/B_min²``: the paper's submodel is a
  *pair* of shards of consecutive sharded layers, and only the hidden layer is sharded here).
* Parameters every client holds (the output bias) form their own group with ``K = 1`` that
  every client selects: it costs ``d + 1`` words per client instead of a padded shard, hides
  the values like any shard and there is no choice to hide. Adding them to every hidden shard
  instead would weight them by ``K_i``.
* :class:`ShardVector` appends one count word to each shard: the fixed-point ``(c·Δ, c)`` of
  the platform's count-weighted averaging.

**Costs** (Theorems 1–2; ``G`` groups, words of 4 bytes on the wire). Offline, client ``i``
uploads ``N - 1`` sealed evaluations of ``Σ_g K_i (d + 1)`` words each (``O(N K_i d)``), computed
as one fused ``(N × (T+1)) @ ((T+1) × d)`` product per slot (:mod:`.coding`): ``N T K_i d``
multiply-adds, not Theorem 2's fast multipoint evaluation — fewer than its bound
``N K_i d log²(K+T) log log(K+T)`` while ``T`` < ~150 (0.6× at N = 100; ``sesa_bench.py``).
Online it uploads ``K_i d`` (``x``) plus ``d`` (``ψ``) words and downloads every
``x`` (``Σ_j K_j d``) and its ``N - 1`` evaluations; computing ``ψ(α_i)`` is one
``(1 × Σ_j K_j) @ (Σ_j K_j × d)`` product, ``O(N d)`` (Theorem 2). The server decodes with one
``(K × (K+T)) @ ((K+T) × d)`` product per group.

**Wire formats**: :mod:`flwr_fsl.families.sesa.messages` (every decoder raises :class:`SesaError`,
a :class:`~flwr_fsl.core.errors.ClientInputError`: drop that client).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError, RoundFailedError, TooFewSurvivorsError
from flwr_fsl.crypto.channel import KEY_BYTES, SealingKeyPair, client_party
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.sealing import seal_for
from flwr_fsl.crypto.sharing import lagrange_matrix
from flwr_fsl.families.sesa.attribution import PIECE_PURPOSE, open_piece, resolve_complaints
from flwr_fsl.families.sesa.coding import mask_evaluations, selector_evaluations
from flwr_fsl.families.sesa.messages import (
    _SEED_BYTES,
    MAX_CLIENTS,
    MAX_GROUPS,
    MAX_LENGTH,
    MAX_SHARDS,
    SesaError,
    SesaGroup,
    SesaParams,
    ShardVector,
    _bundle_from_bytes,
    _bundle_to_bytes,
    _check_id,
    _decode_piece,  # noqa: F401  (re-exported)
    _encode_piece,
    _evaluation_from_bytes,
    _evaluation_to_bytes,
    _int,
    _masked_from_bytes,
    _masked_to_bytes,
    _read_masked,
    _Request,
    _request_from_bytes,
    _request_to_bytes,
    _roster_from_bytes,
    _roster_to_bytes,
    _State,
    _state_from_bytes,
    _state_to_bytes,
    bundle_bytes,
    decode_ids,
    encode_ids,
    mailbox_to_bytes,
)

__all__ = [
    "MAX_CLIENTS",
    "MAX_GROUPS",
    "MAX_LENGTH",
    "PIECE_PURPOSE",
    "TAG_SESA",
    "SesaClient",
    "SesaError",
    "SesaGroup",
    "SesaParams",
    "SesaServer",
    "ShardVector",
    "TooFewSurvivorsError",
    "bundle_bytes",
    "choose_shards",
    "decode_ids",
    "encode_ids",
    "mask_evaluations",
    "selector_evaluations",
]

_U64 = np.uint64
TAG_SESA = 0x6B736D2D61736573  # b"sesa-msk" little-endian
"""PRF domain tag of the streams a client's masks and coefficients are drawn from."""


def choose_shards(shards: int, count: int) -> tuple[int, ...]:
    """Pick ``count`` of ``shards`` shard ids uniformly at random without replacement (OS RNG).

    Parameters
    ----------
    shards : int
        ``K``.
    count : int
        ``K_i`` in ``[1, K]``.

    Returns
    -------
    tuple of int
        The chosen ids, increasing (the slot order).

    Raises
    ------
    ConfigurationError
        If ``count`` is not in ``[1, shards]``.
    """
    k = _int(shards, "shards", 1, MAX_SHARDS)
    c = _int(count, "shards per client", 1, k)
    return tuple(sorted(secrets.SystemRandom().sample(range(k), c)))


@dataclass(frozen=True)
class _Draws:
    r: NDArray[np.uint64]  # (K_i, d)
    u: NDArray[np.uint64]  # (K_i, T)
    v: NDArray[np.uint64] | None  # (T, K_i, d); None when only r was drawn


def _draws(params: SesaParams, seed: bytes, group: int, slots: int, *, full: bool) -> _Draws:
    """Draw a client's randomness for one group from its seed: ``r`` first, then ``u``, ``v``."""
    g = params.groups[group]
    stream = PRGStream.from_seed(seed, group, TAG_SESA)
    f = params.field
    r = f.random((slots, g.length), stream)
    if not full:
        return _Draws(r, np.zeros((slots, 0), dtype=_U64), None)
    u = f.random((slots, params.privacy), stream)
    v = f.random((params.privacy, slots, g.length), stream)
    return _Draws(r, u, v)


def _basis(params: SesaParams, group: int, positions: ArrayLike) -> NDArray[np.uint64]:
    return lagrange_matrix(params.field, params.betas(group), params.alphas(positions))


# ---------------------------------------------------------------------------------- client


@dataclass
class SesaClient:
    """One client's side of a round; its state survives between messages (:meth:`to_bytes`).

    Parameters
    ----------
    node : int
        This client's id (the Flower node id).
    params : SesaParams
        The round.
    shards : sequence of sequence of int
        Per group, the chosen shard ids (strictly increasing, in ``[0, K)``, at least one):
        the slot order. :func:`choose_shards` draws them uniformly.

    Raises
    ------
    ConfigurationError
        If the shard choice does not fit the groups.
    """

    node: int
    params: SesaParams
    shards: tuple[tuple[int, ...], ...]
    key: SealingKeyPair = field(default_factory=SealingKeyPair.generate, repr=False)
    seed: bytes = field(default_factory=lambda: os.urandom(_SEED_BYTES), repr=False)
    roster: dict[int, bytes] = field(default_factory=dict)
    sharers: tuple[int, ...] = ()
    evaluated: bool = False

    def __post_init__(self) -> None:
        _int(self.node, "node", 0, (1 << 64) - 1)
        if not isinstance(self.params, SesaParams):
            raise ConfigurationError("SESA client params must be SesaParams")
        choice = tuple(tuple(int(s) for s in group) for group in self.shards)
        if len(choice) != len(self.params.groups):
            raise ConfigurationError(
                f"a shard choice per group is needed ({len(self.params.groups)}), got {len(choice)}"
            )
        for group, g in zip(choice, self.params.groups, strict=True):
            if not group or any(not 0 <= s < g.shards for s in group):
                raise ConfigurationError(f"shards must be 1 to {g.shards} ids in [0, {g.shards})")
            if any(b <= a for a, b in itertools.pairwise(group)):
                raise ConfigurationError("chosen shards must be strictly increasing")
        self.shards = choice
        if not isinstance(self.seed, bytes) or len(self.seed) != _SEED_BYTES:
            raise ConfigurationError(f"the seed must be {_SEED_BYTES} bytes")

    @property
    def slots(self) -> tuple[int, ...]:
        """``K_i`` per group."""
        return tuple(len(s) for s in self.shards)

    def advertise(self) -> bytes:
        """Round 0: this client's 32-byte X25519 public key."""
        return self.key.public_bytes

    def offline(self, roster: bytes) -> bytes:
        """Round 1: check the roster and return the sealed evaluations for everyone else.

        Parameters
        ----------
        roster : bytes
            ``U1`` with the public keys (:meth:`SesaServer.roster`).

        Returns
        -------
        bytes
            The ``FSEB`` bundle: group count, ``K_i`` per group, then recipient -> sealed
            ``{ϕ_ik(α_j), φ_ik(α_j)}``.

        Raises
        ------
        SesaError
            If the roster is malformed, lacks this client's key, repeats a key, is smaller
            than ``K_max + T`` or larger than the points allow, or this was done already.
        """
        if self.roster:
            raise SesaError("the offline evaluations were already made for this round")
        entries = _roster_from_bytes(roster)
        if entries.get(self.node) != self.key.public_bytes:
            raise SesaError("the roster does not hold this client's own public key")
        if not self.params.threshold <= len(entries) <= self.params.max_clients:
            raise SesaError(
                f"the roster has {len(entries)} clients; a round needs K_max + T = "
                f"{self.params.threshold} to {self.params.max_clients}"
            )
        order = sorted(entries)
        others = [q for q, j in enumerate(order) if j != self.node]
        per_group = []
        for g in range(len(self.params.groups)):
            draws = _draws(self.params, self.seed, g, self.slots[g], full=True)
            basis = _basis(self.params, g, others)
            f = self.params.field
            phi = selector_evaluations(f, basis, self.shards[g], draws.u)
            assert draws.v is not None
            mask = mask_evaluations(f, basis, self.shards[g], draws.r, draws.v)
            per_group.append((phi, mask))
        binding = self.params.binding
        sealed = []
        for row, q in enumerate(others):
            peer = order[q]
            plain = _encode_piece(
                self.node,
                peer,
                [phi[row] for phi, _ in per_group],
                [mask[row] for _, mask in per_group],
            )
            blob = seal_for(
                entries[peer],
                plain,
                purpose=PIECE_PURPOSE,
                binding=binding,
                sender=client_party(self.node),
                recipient=client_party(peer),
            )
            sealed.append((peer, blob))
        self.roster = entries
        return _bundle_to_bytes(self.slots, sealed)

    def masked_update(
        self,
        sharers: Sequence[int],
        updates: Sequence[NDArray[np.uint64]],
        complaint: Sequence[int] = (),
    ) -> bytes:
        """Round 2 (eq. 23): ``x_ik = ḡ_{i,s_k} - r_ik`` for every slot of every group.

        Parameters
        ----------
        sharers : sequence of int
            ``U2``, the clients whose offline bundle the server relays.
        updates : sequence of numpy.ndarray
            Per group, ``(K_i, d)`` field elements: the update of each chosen shard, in slot
            order (e.g. :meth:`ShardVector.encode`).
        complaint : sequence of int
            The members of ``U2`` whose sealed evaluations did not open for this client
            (:func:`~flwr_fsl.families.sesa.attribution.unopened`).

        Returns
        -------
        bytes
            The ``FSEX`` masked update.

        Raises
        ------
        SesaError
            If this is out of order or repeated, ``U2`` does not hold this client or lies
            outside the roster, is smaller than ``K_max + T``, or an update is malformed.
        """
        u2 = tuple(sorted({_check_id(v) for v in sharers}))
        if not self.roster:
            raise SesaError("masked update asked before the offline phase")
        if self.sharers:
            raise SesaError("the masked update was already sent for this round")
        if self.node not in u2 or not set(u2) <= set(self.roster):
            raise SesaError("U2 must hold this client and lie in the roster")
        if len(u2) < self.params.threshold:
            raise SesaError(f"U2 is smaller than K_max + T = {self.params.threshold}")
        if len(updates) != len(self.params.groups):
            raise SesaError("one update block per group is needed")
        f = self.params.field
        masked = []
        for g, (block, k) in enumerate(zip(updates, self.slots, strict=True)):
            shape = (k, self.params.groups[g].length)
            vec = f.validate(block, "shard update", shape)
            r = _draws(self.params, self.seed, g, k, full=False).r
            masked.append(f.sub(vec, r))
        self.sharers = u2
        return _masked_to_bytes(masked, self.params, complaint)

    def evaluate(self, request: bytes) -> bytes:
        """Round 3 (eq. 24): ``ψ(α_i) = Σ_{j ∈ U3} Σ_k x_jk ϕ_jk(α_i) + φ_jk(α_i)``.

        Parameters
        ----------
        request : bytes
            The ``FSED`` request (:meth:`SesaServer.evaluation_request`).

        Returns
        -------
        bytes
            The ``FSEE`` evaluation: ``d`` words per group.

        Raises
        ------
        SesaError
            If the request is malformed, out of order or repeated, ``U3`` is not a subset of
            ``U2`` holding this client or is smaller than ``K_max + T``, or a relayed piece
            does not open, names other parties or disagrees with its sender's masked update.
        """
        if not self.sharers:
            raise SesaError("evaluation asked before the masked update was sent")
        if self.evaluated:
            raise SesaError("the evaluation was already sent for this round")
        req = _request_from_bytes(request, self.node)
        u3 = set(req.survivors)
        if self.node not in u3 or not u3 <= set(self.sharers):
            raise SesaError("U3 must hold this client and lie in U2")
        if len(u3) < self.params.threshold:
            raise SesaError(f"U3 is smaller than K_max + T = {self.params.threshold}")
        f = self.params.field
        order = sorted(self.roster)
        me = order.index(self.node)
        xs: list[list[NDArray[np.uint64]]] = [[] for _ in self.params.groups]
        coefs: list[list[NDArray[np.uint64]]] = [[] for _ in self.params.groups]
        masks: list[list[NDArray[np.uint64]]] = [[] for _ in self.params.groups]
        for j in req.survivors:
            x = _masked_from_bytes(req.masked[j], self.params)
            slots = [b.shape[0] for b in x]
            if j == self.node:
                if tuple(slots) != self.slots:
                    raise SesaError("the relayed masked update of this client is not its own")
                pieces = self._own_evaluations(me)
            else:
                pieces = open_piece(self.key, self.params, j, self.node, req.pieces[j], slots)
            for g, (phi, mask) in enumerate(pieces):
                xs[g].append(x[g])
                coefs[g].append(phi)
                masks[g].append(mask)
        psi = []
        for g in range(len(self.params.groups)):
            c = np.concatenate(coefs[g])[None, :]
            weighted = f.matmul(c, np.concatenate(xs[g]))[0]
            psi.append(f.add(weighted, f.sum(np.concatenate(masks[g]), axis=0)))
        self.evaluated = True
        return _evaluation_to_bytes(psi)

    def _own_evaluations(
        self, position: int
    ) -> list[tuple[NDArray[np.uint64], NDArray[np.uint64]]]:
        """Recompute this client's own ``{ϕ_ik(α_i), φ_ik(α_i)}`` from its seed."""
        f = self.params.field
        out = []
        for g in range(len(self.params.groups)):
            draws = _draws(self.params, self.seed, g, self.slots[g], full=True)
            assert draws.v is not None
            basis = _basis(self.params, g, [position])
            phi = selector_evaluations(f, basis, self.shards[g], draws.u)[0]
            mask = mask_evaluations(f, basis, self.shards[g], draws.r, draws.v)[0]
            out.append((phi, mask))
        return out

    # -- state between messages ---------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Return this client's secret state as ``FSEC`` v1 bytes (it never leaves the client).

        Node, private key, seed, parameters, the shard choice, the roster (empty before the
        offline phase), ``U2`` and whether it evaluated.
        """
        return _state_to_bytes(
            _State(
                self.node,
                self.key.private_bytes(),
                self.seed,
                self.params,
                self.shards,
                self.roster,
                self.sharers,
                self.evaluated,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SesaClient:
        """Strict decoder of :meth:`to_bytes` (raises :class:`SesaError`)."""
        s = _state_from_bytes(data)
        try:
            key = SealingKeyPair.from_private_bytes(s.private)
            client = cls(s.node, s.params, s.shards, key, s.seed, s.roster, s.sharers, s.evaluated)
        except (ValueError, ConfigurationError) as err:
            raise SesaError(f"a SESA client state is invalid: {err}") from err
        if (s.roster and s.roster.get(s.node) != key.public_bytes) or (s.sharers and not s.roster):
            raise SesaError("a SESA client state is inconsistent")
        return client


# ---------------------------------------------------------------------------------- server


@dataclass
class SesaServer:
    """The server's side of one round: relays, collects ``ψ(α_i)``, decodes per-shard sums.

    Call in order: :meth:`add_advertisement` per client, :meth:`roster`, :meth:`add_bundle`
    per client, :meth:`sharers`, :meth:`add_masked` per client, :meth:`evaluation_request`
    per survivor, :meth:`add_evaluation` per survivor, :meth:`result`. A malformed message
    raises :class:`SesaError` and its client is simply not added (it counts as dropped at
    that step).

    Parameters
    ----------
    params : SesaParams
        The round.
    """

    params: SesaParams
    _keys: dict[int, bytes] = field(default_factory=dict)
    _roster: dict[int, bytes] | None = None
    _mailbox: dict[int, dict[int, memoryview]] = field(default_factory=dict)  # views: no copy
    _slots: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _sharers: tuple[int, ...] | None = None
    _masked: dict[int, bytes] = field(default_factory=dict)
    _closed: bool = False
    _complaints: dict[int, tuple[int, ...]] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    _evaluations: dict[int, list[NDArray[np.uint64]]] = field(default_factory=dict)

    def add_advertisement(self, node: int, public_key: bytes) -> None:
        """Round 0: take a client's public key (raises :class:`SesaError`)."""
        node = _check_id(node)
        if self._roster is not None:
            raise SesaError("advertisement after the roster was sent")
        if not isinstance(public_key, bytes) or len(public_key) != KEY_BYTES:
            raise SesaError(f"an advertisement must be a {KEY_BYTES}-byte public key")
        if node in self._keys or public_key in self._keys.values():
            raise SesaError("an advertisement repeats a client or a public key")
        self._keys[node] = public_key

    def roster(self) -> bytes:
        """Close round 0 and return ``U1`` with its keys (the same bytes for every client).

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``K_max + T`` clients advertised.
        RoundFailedError
            If more clients advertised than the evaluation points allow.
        """
        if self._roster is None:
            self._need(len(self._keys), "advertised keys")
            if len(self._keys) > self.params.max_clients:
                raise RoundFailedError(
                    f"{len(self._keys)} clients, more than the {self.params.max_clients} "
                    f"evaluation points F_{self.params.prime} leaves"
                )
            self._roster = dict(sorted(self._keys.items()))
        return _roster_to_bytes(self._roster)

    def add_bundle(self, node: int, bundle: bytes) -> None:
        """Round 1: take a client's sealed evaluations, one for every other roster member.

        Raises
        ------
        SesaError
            If the bundle is malformed, its slot counts are out of range, it does not
            address exactly the other roster members, or a blob has the wrong size.
        """
        if self._roster is None or self._sharers is not None:
            raise SesaError("a bundle outside the offline round")
        node = _check_id(node)
        if node not in self._roster or node in self._slots:
            raise SesaError("a bundle from a client outside the roster, or twice")
        slots, sealed = _bundle_from_bytes(bundle, self.params)
        if set(sealed) != set(self._roster) - {node}:
            raise SesaError("a bundle must address every other roster member once")
        for peer, blob in sealed.items():
            self._mailbox.setdefault(peer, {})[node] = blob
        self._slots[node] = slots

    def sharers(self) -> tuple[int, ...]:
        """Close round 1 and return ``U2``, the clients whose bundle arrived.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``K_max + T`` clients sent one.
        """
        if self._sharers is None:
            if self._roster is None:
                raise RoundFailedError("sharers asked before the roster")
            self._need(len(self._slots), "offline bundles")
            self._sharers = tuple(sorted(self._slots))
        return self._sharers

    def slots_of(self, node: int) -> tuple[int, ...] | None:
        """``K_i`` per group that a client announced (None if it sent no bundle)."""
        return self._slots.get(node)

    def add_masked(self, node: int, masked: bytes) -> None:
        """Round 2: take a client's masked update (raises :class:`SesaError`)."""
        u2 = self.sharers()
        node = _check_id(node)
        if node not in u2 or node in self._masked or self._closed:
            raise SesaError("a masked update from a client outside U2, twice or too late")
        _, complaint = _read_masked(masked, self.params, self._slots[node])
        self._masked[node] = masked
        self._complaints[node] = complaint

    def keep(self, nodes: Iterable[int]) -> None:
        """Keep only ``nodes`` at the open step (the engine's survivors): forget the others.

        Before ``U2`` closes it forgets bundles, before ``U3`` closes masked updates, after
        it evaluations.
        """
        kept = set(nodes)
        if self._sharers is None:
            for gone in set(self._slots) - kept:
                del self._slots[gone]
                for box in self._mailbox.values():
                    box.pop(gone, None)
        elif not self._closed:
            for gone in set(self._masked) - kept:
                del self._masked[gone], self._complaints[gone]
        else:
            for gone in set(self._evaluations) - kept:
                del self._evaluations[gone]

    def mailbox(self, node: int) -> bytes:
        """Return the ``FSEM`` pieces the others of ``U2`` sealed to ``node`` (for ``train``)."""
        box = self._mailbox.get(node, {})
        return mailbox_to_bytes({j: (self._slots[j], box[j]) for j in self.sharers() if j != node})

    def settle(self) -> dict[int, str]:
        """Close round 2: exclude by the complaints (module :mod:`.attribution`); node -> reason.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``K_max + T`` masked updates are left.
        """
        excluded = resolve_complaints(self._complaints, list(self._masked))
        self.keep([j for j in self._masked if j not in excluded])
        self._need(len(self._masked), "masked updates after the complaints")
        self._closed = True
        return excluded

    @property
    def survivors(self) -> tuple[int, ...]:
        """``U3``: the clients whose masked update is aggregated."""
        return tuple(sorted(self._masked))

    def evaluation_request(self, node: int) -> bytes:
        """Round 3: ``U3``, every ``x`` of ``U3`` and the evaluations addressed to ``node``.

        Closes round 2 (later masked updates are refused).

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``K_max + T`` clients sent a masked update.
        SesaError
            If ``node`` is not in ``U3``.
        """
        self._need(len(self._masked), "masked updates")
        self._closed = True
        if node not in self._masked:
            raise SesaError("an evaluation request for a client outside U3")
        u3 = self.survivors
        box = self._mailbox.get(node, {})
        req = _Request(u3, self._masked, {j: bytes(box[j]) for j in u3 if j != node})
        return _request_to_bytes(req)

    def add_evaluation(self, node: int, evaluation: bytes) -> None:
        """Round 3: take a survivor's ``ψ(α_i)`` (raises :class:`SesaError`)."""
        node = _check_id(node)
        if not self._closed or node not in self._masked or node in self._evaluations:
            raise SesaError("an evaluation from a client outside U3, or twice")
        self._evaluations[node] = _evaluation_from_bytes(evaluation, self.params)

    @property
    def evaluators(self) -> tuple[int, ...]:
        """``U4``: the clients whose ``ψ(α_i)`` arrived."""
        return tuple(sorted(self._evaluations))

    def contributors(self) -> dict[int, tuple[int, ...]]:
        """``K_i`` per group of every client of ``U3`` (what message sizes show anyway)."""
        return {j: self._slots[j] for j in self.survivors}

    def result(self, *, check: bool = True) -> list[NDArray[np.uint64]]:
        """Decode ``ψ`` and return, per group, the ``(K, d)`` per-shard sums over ``U3`` (eq. 28).

        With ``K_max + T + 2`` or more evaluations, one that does not lie on the polynomial all
        the others lie on is attributed: its sender lands in :attr:`rejected` and the rest
        decode (two different single exclusions cannot both fit: their polynomials would
        share ``K_max + T`` points).

        Parameters
        ----------
        check : bool, optional
            Check that evaluations beyond ``K + T`` lie on the decoded polynomial.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``K_max + T`` evaluations arrived.
        RoundFailedError
            If the evaluations are inconsistent and no single one can be blamed.
        """
        self._need(len(self._evaluations), "evaluations")
        u4 = self.evaluators
        out = self._decode(u4, check)
        if out is not None:
            return out
        if len(u4) >= self.params.threshold + 2:
            fits = [(j, self._decode(tuple(x for x in u4 if x != j), True)) for j in u4]
            found = [(j, o) for j, o in fits if o is not None]
            if len(found) == 1:
                j, decoded = found[0]
                del self._evaluations[j]
                self.rejected[j] = (
                    "decode: its evaluation does not lie on the polynomial all others lie on"
                )
                return decoded
        raise RoundFailedError(
            f"SESA evaluations of {list(u4)} do not lie on one polynomial: a client deviated "
            "(not attributable: fewer than K_max + T + 2 evaluations or several deviate)"
        )

    def _decode(self, u4: tuple[int, ...], check: bool) -> list[NDArray[np.uint64]] | None:
        """Interpolate from the first ``K + T`` of ``u4``; None if a later one disagrees."""
        assert self._roster is not None
        order = sorted(self._roster)
        positions = np.asarray([order.index(j) for j in u4], dtype=np.int64)
        f = self.params.field
        out = []
        for g, grp in enumerate(self.params.groups):
            need = grp.shards + self.params.privacy
            nodes = self.params.alphas(positions[:need])
            values = np.stack([self._evaluations[j][g] for j in u4[:need]])
            targets = self.params.betas(g)[: grp.shards]
            if check and len(u4) > need:
                targets = np.concatenate([targets, self.params.alphas(positions[need:])])
            decoded = f.matmul(lagrange_matrix(f, nodes, targets), values)
            if check and len(u4) > need:
                extra = np.stack([self._evaluations[j][g] for j in u4[need:]])
                if not np.array_equal(decoded[grp.shards :], extra):
                    return None
            out.append(decoded[: grp.shards])
        return out

    def _need(self, count: int, what: str) -> None:
        if count < self.params.threshold:
            raise TooFewSurvivorsError(
                f"{count} {what}, fewer than K_max + T = {self.params.threshold}"
            )
