"""Byte layout of a DPF public body (the wire format of :mod:`flwr_fsl.crypto.dpf_keys`), in place.

The format is documented in :mod:`flwr_fsl.crypto.dpf_keys`; this module only knows where each
field starts, so a serializer can allocate the whole blob once and write every field straight
into it (:func:`write_public_body`), and key generation can let its kernels write the seed and
leaf correction words directly into their final place (:func:`public_layout`,
:func:`u64_view`). Every multi-byte field is little-endian; the ``uint64`` views here are
``<u8`` views of the byte buffer (on a little-endian machine the native ``uint64``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "PublicLayout",
    "pack_cw_bits_into",
    "public_layout",
    "u64_view",
    "write_prefix",
    "write_public_body",
]

EPOCH_SHARED, EPOCH_PER_KEY = 0, 1
"""``epoch_mode`` byte: one epoch for every key, or one per key."""


@dataclass(frozen=True)
class PublicLayout:
    """Byte offsets of a public body's fields inside a buffer (the body starts at ``start``).

    Attributes
    ----------
    start : int
        Offset of the ``epoch_mode`` byte.
    m, words, levels : int
        Number of keys, leaf words per key ``W`` and total tree levels ``L``.
    proof : bool
        Whether the body ends with the keys' proof correction words (version 3).
    shared_epoch : bool
        ``epoch_mode`` 0 (one epoch) rather than 1 (one per key).
    """

    start: int
    m: int
    words: int
    levels: int
    proof: bool
    shared_epoch: bool

    @property
    def domain_bits(self) -> int:
        """Offset of the ``m`` domain-size bytes."""
        return self.start + 1

    @property
    def epochs(self) -> int:
        """Offset of the epoch words (the domain bytes are zero-padded to 8 bytes)."""
        return self.start + 1 + self.m + (-(1 + self.m)) % 8

    @property
    def num_epochs(self) -> int:
        """Epoch words on the wire: 1 (shared) or ``m``."""
        return 1 if self.shared_epoch else self.m

    @property
    def leaf(self) -> int:
        """Offset of ``cw_leaf`` (``m * W`` words)."""
        return self.epochs + 8 * self.num_epochs

    @property
    def seeds(self) -> int:
        """Offset of ``cw_seeds`` (``2 L`` words)."""
        return self.leaf + 8 * self.m * self.words

    @property
    def bits(self) -> int:
        """Offset of the packed control bits (``ceil(L / 4)`` bytes)."""
        return self.seeds + 16 * self.levels

    @property
    def proof_at(self) -> int:
        """Offset of ``cw_proof`` (``8 m`` words, version 3 only; not 8-byte aligned)."""
        return self.bits + (self.levels + 3) // 4

    @property
    def end(self) -> int:
        """Offset one past the body."""
        return self.proof_at + (64 * self.m if self.proof else 0)


def public_layout(
    start: int, m: int, words: int, levels: int, proof: bool, shared_epoch: bool
) -> PublicLayout:
    """Return the layout of a public body of these sizes starting at byte ``start``."""
    return PublicLayout(start, m, words, levels, proof, shared_epoch and m >= 1)


def u64_view(buf: NDArray[np.uint8], offset: int, count: int) -> NDArray[np.uint64]:
    """Return ``count`` little-endian words of the byte buffer ``buf`` from ``offset`` (a view)."""
    return buf[offset : offset + 8 * count].view("<u8")


def pack_cw_bits_into(bits: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
    """Pack 2-bit control-bit corrections 4 per byte into ``out`` (``ceil(L / 4)`` bytes).

    Level ``i`` goes to bits ``2 * (i % 4)`` and ``2 * (i % 4) + 1`` of byte ``i // 4``; the
    unused high bits of the last byte are 0.
    """
    n = bits.shape[0]
    whole = n // 4
    quads = bits[: 4 * whole].reshape(-1, 4)
    head = out[:whole]
    np.left_shift(quads[:, 3], 6, out=head)
    head |= quads[:, 2] << 4
    head |= quads[:, 1] << 2
    head |= quads[:, 0]
    if n % 4:
        tail = 0
        for i, b in enumerate(bits[4 * whole :].tolist()):
            tail |= int(b) << (2 * i)
        out[whole] = tail


def write_prefix(
    buf: NDArray[np.uint8],
    lay: PublicLayout,
    domain_bits: NDArray[np.uint8],
    epochs: NDArray[np.uint64],
) -> None:
    """Write ``epoch_mode``, the domain bytes with their zero padding and the epoch words."""
    buf[lay.start] = EPOCH_SHARED if lay.shared_epoch else EPOCH_PER_KEY
    buf[lay.domain_bits : lay.domain_bits + lay.m] = domain_bits
    buf[lay.domain_bits + lay.m : lay.epochs] = 0
    u64_view(buf, lay.epochs, lay.num_epochs)[:] = epochs[: lay.num_epochs]


def write_public_body(
    buf: NDArray[np.uint8],
    lay: PublicLayout,
    domain_bits: NDArray[np.uint8],
    epochs: NDArray[np.uint64],
    cw_leaf: NDArray[np.uint64],
    cw_seeds: NDArray[np.uint64],
    cw_bits: NDArray[np.uint8],
    cw_proof: NDArray[np.uint64] | None,
) -> None:
    """Write a whole public body into ``buf[lay.start : lay.end]`` (one copy of each field)."""
    write_prefix(buf, lay, domain_bits, epochs)
    u64_view(buf, lay.leaf, lay.m * lay.words)[:] = cw_leaf.reshape(-1)
    u64_view(buf, lay.seeds, 2 * lay.levels)[:] = cw_seeds.reshape(-1)
    pack_cw_bits_into(cw_bits, buf[lay.bits : lay.proof_at])
    if cw_proof is not None:
        u64_view(buf, lay.proof_at, 8 * lay.m)[:] = cw_proof.reshape(-1)
