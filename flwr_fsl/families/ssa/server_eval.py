"""An SSA server's checked evaluation of one client: key check and value check on every thread.

:class:`~flwr_fsl.families.ssa.protocol.SSAServer` calls :func:`evaluate_checked` for each client
of a checked round. The key check (:class:`~flwr_fsl.families.ssa.verify.KeyCheck`) evaluates
the keys in segments on the server's threads; with the projected value check (the default,
:mod:`flwr_fsl.families.ssa.projected_check`) the same segments also sum each key's value words
(no second pass over the evaluation output), the hash of the keys' public part runs as one more
task beside them, and the ``r`` projections run in column ranges on the threads
(:func:`~flwr_fsl.families.ssa.projected_check.project_shares`). Before session 29 the value
check ran after the evaluation on one thread: a second pass over the output, the hash and an
int64 matrix product (about as long as the evaluation itself at ``m = 2**20``, ``k/m = 10%``).
The digest and the check blob are the same bytes (``tests/families/ssa/test_server_check.py``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.families.ssa.messages import SSAParams
from flwr_fsl.families.ssa.projected_check import (
    public_digest,
    server_projected,
    value_round_check,
)
from flwr_fsl.families.ssa.verify import DIGEST_BYTES, KeyCheck

__all__ = ["evaluate_checked"]


def evaluate_checked(
    params: SSAParams,
    check: KeyCheck,
    keys: DPFKeyBatch,
    out: NDArray[np.uint64] | None,
    client: int,
    trailer: bytes | None,
    expect: bytes | None,
    offsets: NDArray[np.int64],
) -> tuple[NDArray[np.uint64], bytes]:
    """Evaluate a client's keys with the round's checks; return the shares and the whole check.

    Parameters
    ----------
    params : SSAParams
        A checked round.
    check : KeyCheck
        The server's key check (its threads run everything here).
    keys : DPFKeyBatch
        This server's shares of the client's keys.
    out : numpy.ndarray, optional
        The server's reused ``(points, tau)`` evaluation buffer.
    client : int
        The client's id (the digest's nonces).
    trailer : bytes, optional
        The value check's trailer (None: the round has no value check).
    expect : bytes, optional
        The other server's check of the client (S1), or None (S0).
    offsets : numpy.ndarray
        Each key's first output row, then the total (the exact value check's input).

    Returns
    -------
    tuple
        The output shares and this server's check: the key-check digest, followed by the
        value check's blob when the round has one.

    Raises
    ------
    SSAInputError
        If the keys are not verifiable or the value-check material does not match this
        server's.
    """
    if trailer is None:
        return check.evaluate(keys, out=out, client=client)
    if params.value_check != "projected":
        values, digest = check.evaluate(keys, out=out, client=client)
        return values, digest + value_round_check(params, keys, values, offsets, trailer, expect)
    sums = np.empty((keys.public.num_keys, params.value_width), np.uint64)
    values, digest, public_hash = check.evaluate_with(
        keys, out=out, client=client, value_sums=sums, side=lambda: public_digest(keys.public)
    )
    blob = server_projected(
        params,
        keys,
        sums,
        trailer,
        expect,
        DIGEST_BYTES,
        public_hash=public_hash,
        threads=check.threads,
    )
    return values, digest + blob
