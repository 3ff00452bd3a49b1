"""A client's stored U-DPF keys (:class:`SSAClientState`) and which rounds can update them.

U-DPF mode (Cui §5, fixed submodels): with an unchanged index set and hash key, a later round
sends only a hint that moves the servers' stored keys to the new payload
(:meth:`SSAClientState.next_round`); :func:`same_layout` decides whether a round's keys carry
over. Split out of :mod:`flwr_fsl.families.ssa.protocol`, which re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import DPFKeyBatch, next_hint_batch, update_batch
from flwr_fsl.families.ssa.messages import (
    Placement,
    SSAParams,
    _state_from_bytes,
    _state_to_bytes,
)
from flwr_fsl.families.ssa.payload import payload_words
from flwr_fsl.families.ssa.projected_check import value_trailer
from flwr_fsl.families.ssa.upload import key_betas as _betas

__all__ = ["SSAClientState", "layout_key", "same_layout"]


@dataclass
class SSAClientState:
    """A client's keys of the current epoch, kept for U-DPF rounds (never sent).

    It holds both servers' key shares, i.e. the client's secret index set and values: keep it
    on the client (e.g. in Flower's ``Context.state``), never on the wire.

    **Binary format v1** (:meth:`to_bytes`, :meth:`from_bytes`), fields of
    :mod:`flwr_fsl.core.wireformat` in this order:

    ========  ====================================================================
    magic     4 raw bytes ``b"FSCS"``
    version   ``u8`` = 1
    params    ``bytes``: :meth:`SSAParams.to_bytes` of the keys' round
    indices   ``array`` int64 ``(n,)``: distinct, in ``[0, m)``, ``n <= k``
    alphas    ``array`` uint64 ``(B + σ,)``: every key's DPF point, below ``2**domain_bits``
    slots     ``array`` int64 ``(B + σ,)``: per key ``EMPTY`` or its index's position;
              every position ``0..n-1`` exactly once
    public    ``bytes``: :meth:`~flwr_fsl.crypto.dpf.DPFPublicBatch.to_bytes`, the keys'
              shared public part (``B + σ`` keys, the round's ``tau``, all at its epoch)
    seeds0    ``array`` uint64 ``(B + σ, 2)``: S0's root seeds
    seeds1    ``array`` uint64 ``(B + σ, 2)``: S1's root seeds
    ========  ====================================================================

    No trailing bytes. The per-key domain sizes are not checked against the round's simple
    table here (that needs the table of all ``m`` indices); the servers check them on every
    hint (:meth:`~flwr_fsl.families.ssa.protocol.SSAServer.add_client_hint`).

    Attributes
    ----------
    params : SSAParams
        The round the keys were made for.
    indices : numpy.ndarray
        The client's (fixed) index set.
    placement : Placement
        Where the indices went.
    keys : tuple[DPFKeyBatch, DPFKeyBatch]
        Both parties' key shares.
    """

    params: SSAParams
    indices: NDArray[np.int64]
    placement: Placement
    keys: tuple[DPFKeyBatch, DPFKeyBatch] = field(repr=False)

    def to_bytes(self) -> bytes:
        """Serialize the state (format v1, see the class docstring).

        Returns
        -------
        bytes
            The encoded state.

        Raises
        ------
        ValueError
            If the two key shares do not share one public part or parties are swapped.
        """
        return _state_to_bytes(self.params, self.indices, self.placement, self.keys)

    @classmethod
    def from_bytes(cls, data: bytes) -> SSAClientState:
        """Parse :meth:`to_bytes` output strictly.

        Every length is checked against the bytes left before anything is allocated, and
        the fields are checked against each other and the stored round.

        Parameters
        ----------
        data : bytes
            The encoded state.

        Returns
        -------
        SSAClientState
            The state (its placement without the cuckoo table).

        Raises
        ------
        SSAInputError
            On any malformed, truncated, extended or inconsistent input. The text names the
            failed check only, never a stored index, value or size (they are secret).
        """
        return cls(*_state_from_bytes(data))

    def next_round(
        self,
        params: SSAParams,
        values: ArrayLike,
        weights: ArrayLike | float,
        rng: np.random.Generator | None = None,
    ) -> bytes:
        """Make the U-DPF hint moving the stored keys to this round's values.

        Parameters
        ----------
        params : SSAParams
            The new round: same hashing, domain and widths, a larger ``epoch``.
        values, weights, rng
            As in :func:`~flwr_fsl.families.ssa.protocol.encode_update`, for the same indices in
            the same order.

        Returns
        -------
        bytes
            The serialized hint (public: both servers get the same bytes).

        Raises
        ------
        ConfigurationError
            If the new round is not compatible with the stored keys.
        """
        if not same_layout(self.params, params) or params.epoch <= self.params.epoch:
            raise ConfigurationError("U-DPF needs the same hashing/layout and a larger epoch")
        payload = payload_words(params, values, weights, rng)
        if payload.shape[0] != self.indices.size:
            raise ConfigurationError("U-DPF rounds must update the same index set")
        betas = _betas(params, payload, self.placement.slots)
        hint = next_hint_batch(
            self.keys[0], self.keys[1], betas, params.epoch, alphas=self.placement.alphas
        )
        self.keys = (
            update_batch(self.keys[0], hint, params.epoch),
            update_batch(self.keys[1], hint, params.epoch),
        )
        self.params = params
        return hint.to_bytes() + value_trailer(params, self.keys, betas)  # value check


def layout_key(params: SSAParams) -> tuple[object, ...]:
    """Return the fields that decide whether U-DPF keys carry over (:func:`same_layout`)."""
    keep: tuple[str, ...] = ("domain_size", "num_items", "value_width", "hash_key", "num_hashes")
    keep += ("count_weighted", "stash_size", "scale_factor", "verify")  # verify: dummy slots
    return tuple(getattr(params, k) for k in keep)


def same_layout(a: SSAParams, b: SSAParams) -> bool:
    """Return True if keys made under ``a`` can be updated (U-DPF) for a round ``b``."""
    return layout_key(a) == layout_key(b)
