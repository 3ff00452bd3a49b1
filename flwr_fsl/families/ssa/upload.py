"""A client's SSA upload written once: its keys' payload, Gen and the value-check trailer in place.

:func:`~flwr_fsl.families.ssa.protocol.encode_update` places the indices and encodes the values;
:func:`encode_keys` then generates the DPF keys with room left after their public part for the
round's value-check trailer (:func:`~flwr_fsl.families.ssa.projected_check.value_trailer`),
which is computed from the finished keys and written into that room before the blob is copied
out (:func:`~flwr_fsl.crypto.dpf_gen.gen_public`'s ``tail``): the upload is the same bytes as
``public.to_bytes() + trailer``, without the second copy of the public part.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.crypto.dpf import DPFKeyBatch, generate_keys_batch
from flwr_fsl.crypto.hashing import EMPTY
from flwr_fsl.families.ssa import projected_check as pc
from flwr_fsl.families.ssa.messages import Placement, SSAParams
from flwr_fsl.families.ssa.verify import checks_counts, one_word

__all__ = ["encode_keys", "key_betas"]

TrailerFn = Callable[
    [SSAParams, tuple[DPFKeyBatch, DPFKeyBatch], NDArray[np.uint64], int | None], bytes
]


def key_betas(
    params: SSAParams, payload: NDArray[np.uint64], slots: NDArray[np.int64]
) -> NDArray[np.uint64]:
    """Return every key's ``key_tau`` payload words: its slot's row of ``payload``, or a dummy's.

    A dummy key's row is zero, with a count word of 1 in a round that checks counts (every key
    then counts exactly 1).
    """
    tau = params.tau
    rows = np.zeros((payload.shape[0] + 1, params.key_tau), np.uint64)  # row 0: a dummy key's
    rows[1:, :tau] = payload
    if checks_counts(params):  # a dummy slot's count word is 1 too: every key counts exactly 1
        rows[0, tau - 1] = one_word(params)
    # Slot s reads row s - EMPTY (EMPTY = -1): row 0, the dummy's, for EMPTY, a client's row
    # s at s + 1; one gather, no mask (issue 26: np.where's passes cost more than the gather).
    return rows.take(slots - EMPTY, axis=0)


def encode_keys(
    params: SSAParams,
    placement: Placement,
    payload: NDArray[np.uint64],
    domain_bits: NDArray[np.int64],
    master_seeds: tuple[bytes, bytes],
    threads: int,
    make_trailer: TrailerFn = pc.value_trailer,
) -> tuple[bytes, tuple[DPFKeyBatch, DPFKeyBatch]]:
    """Generate a client's keys and return its upload blob (public part, then trailer) and keys.

    Parameters
    ----------
    params : SSAParams
        The round.
    placement : Placement
        Every key's point and slot.
    payload : numpy.ndarray
        ``(n, tau)`` payload words of the client's indices.
    domain_bits : numpy.ndarray
        Every key's domain (bits).
    master_seeds : tuple[bytes, bytes]
        The servers' master seeds.
    threads : int
        Gen threads, and the trailer's (its digest and projections).
    make_trailer : callable, optional
        ``(params, keys, betas, threads) -> bytes``, the round's trailer, made on the encode's
        ``threads`` (default
        :func:`~flwr_fsl.families.ssa.projected_check.value_trailer`; its size must be
        :func:`~flwr_fsl.families.ssa.projected_check.value_trailer_bytes`).

    Returns
    -------
    tuple[bytes, tuple[DPFKeyBatch, DPFKeyBatch]]
        The public part followed by the round's value-check trailer, and both servers' keys.
    """
    betas = key_betas(params, payload, placement.slots)
    size = pc.value_trailer_bytes(params)

    def trailer(keys: tuple[DPFKeyBatch, DPFKeyBatch]) -> bytes:
        return make_trailer(params, keys, betas, threads)

    k0, k1 = generate_keys_batch(
        placement.alphas,
        betas,
        domain_bits,
        master_seeds=master_seeds,
        epoch=params.epoch,
        verifiable=params.verify,
        threads=threads,
        tail=None if size == 0 else (size, trailer),
    )
    return k0.public.blob(), (k0, k1)
