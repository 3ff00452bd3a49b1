"""A malicious SSA client's tools (tests only): keys with chosen points, words and tampering.

A client that ignores :func:`~flwr_fsl.families.ssa.protocol.encode_update` can call the DPF
directly: any point, any words in Z_2^64, any change to the public part. These helpers build
such uploads (sealed to S1 like an honest client's, with a range-check trailer for its value
words clipped into the bound) so the tests can show which forgeries the servers' key check
(:mod:`flwr_fsl.families.ssa.verify`, :mod:`flwr_fsl.families.ssa.range_check`) catches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import DPFPublicBatch, generate_keys_batch
from flwr_fsl.crypto.hashing import EMPTY
from flwr_fsl.families.ssa.projected_check import value_trailer
from flwr_fsl.families.ssa.protocol import (
    SSAParams,
    key_domain_bits,
    payload_words,
    place_indices,
    simple_table_for,
)
from flwr_fsl.families.ssa.range_check import round_bound
from flwr_fsl.families.ssa.sealing import seal_ssa_upload
from flwr_fsl.families.ssa.two_server import ClientUpload
from flwr_fsl.families.ssa.upload import key_betas
from flwr_fsl.families.ssa.verify import one_word
from tests.helper.test_helper import signer_of

Tamper = Callable[[DPFPublicBatch], DPFPublicBatch]


@dataclass
class Plan:
    """Every key's point and words (what an honest client would use), to be edited."""

    alphas: np.ndarray
    betas: np.ndarray
    slots: np.ndarray


def honest_plan(params: SSAParams, indices: np.ndarray, values: np.ndarray) -> Plan:
    """The points and payload words an honest client with these indices and values uses."""
    placement = place_indices(params, indices)
    payload = payload_words(params, values, 1.0)
    return Plan(
        placement.alphas.copy(), key_betas(params, payload, placement.slots), placement.slots
    )


def real_key(plan: Plan) -> int:
    """Index of the first key that carries a real element."""
    return int(np.flatnonzero(plan.slots != EMPTY)[0])


def dummy_key(plan: Plan, params: SSAParams) -> int:
    """Index of the first bin key that carries no element (a dummy bin)."""
    num_bins = params.hash_params.num_bins
    return int(np.flatnonzero(plan.slots[:num_bins] == EMPTY)[0])


def count_column(params: SSAParams) -> int:
    """The count word's column in a point's words."""
    return params.tau - 1


def one(params: SSAParams) -> np.uint64:
    """The fixed-point 1.0 (every checked key's count word)."""
    return one_word(params)


def flip_last_level(key: int) -> Tamper:
    """Change key ``key``'s last seed correction word: its point *and* the sibling leaf differ."""

    def tamper(pub: DPFPublicBatch) -> DPFPublicBatch:
        cw = pub.cw_seeds.copy()
        last = int(pub.level_offsets[key + 1]) - 1
        cw[last, 1] ^= np.uint64(0x5A5A)
        return replace(pub, cw_seeds=cw)

    return tamper


def flip_proof(key: int) -> Tamper:
    """Flip one bit of key ``key``'s proof correction word."""

    def tamper(pub: DPFPublicBatch) -> DPFPublicBatch:
        assert pub.cw_proof is not None
        cw = pub.cw_proof.copy()
        cw[key, 3] ^= np.uint64(1 << 17)
        return replace(pub, cw_proof=cw)

    return tamper


def clipped(params: SSAParams, betas: np.ndarray) -> np.ndarray:
    """``betas`` with every value word clipped into the round's range-check bound."""
    bound = round_bound(params)
    out = betas.copy()
    words = out[:, : params.value_width].view(np.int64)
    out[:, : params.value_width] = np.clip(words, -bound, bound).view(np.uint64)
    return out


def forged_trailer(
    params: SSAParams,
    keys: tuple,  # type: ignore[type-arg]
    betas: np.ndarray,
    threads: int | None = None,
) -> bytes:
    """The forger's value-check trailer for keys whose real words are ``betas``.

    Exact check: it claims its value words clipped into the bound (the best it can do: an
    out-of-range word has no bit decomposition). Projected check: the real words when some
    salt's projections pass (as an honest client's), else the clipped words' projections.
    """
    if params.value_check_mode == "projected":
        try:
            return value_trailer(params, keys, betas, threads)
        except ConfigurationError:
            pass
    return value_trailer(params, keys, clipped(params, betas), threads)


def forged_upload(
    params: SSAParams,
    plan: Plan,
    client_id: int,
    helper_pub: bytes,
    binding: object,
    tamper: Tamper | None = None,
    seed: int = 0,
) -> tuple[ClientUpload, bytes]:
    """Keys for ``plan`` (optionally tampered), sealed to S1 like an honest client's.

    Returns the upload as S0 receives it and the public part.
    """
    rng = np.random.default_rng(seed)
    msk = (rng.bytes(16), rng.bytes(16))
    table = simple_table_for(params)
    k0, k1 = generate_keys_batch(
        plan.alphas,
        plan.betas,
        key_domain_bits(params, table),
        master_seeds=msk,
        epoch=params.epoch,
        verifiable=params.verify,
    )
    pub = k0.public if tamper is None else tamper(k0.public)
    public = pub.to_bytes()
    public += forged_trailer(params, (k0, k1), plan.betas)
    sealed = seal_ssa_upload(
        helper_pub,
        binding=binding,  # type: ignore[arg-type]
        client_id=client_id,
        public_part=public,
        master_seed=msk[1],
        signer=signer_of(client_id),
    )
    return ClientUpload(public, msk[0], sealed), public
