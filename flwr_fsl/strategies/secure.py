"""``SecureFedSubAvg``: top-k federated submodel learning with two-server secure aggregation.

This strategy is S0 of Cui et al.'s SSA (Fig. 4) inside Flower's ServerApp; S1 is the helper
process (:mod:`flwr_fsl.helper`), reached through a :class:`~flwr_fsl.helper.HelperConnection`
(gRPC in deployment, the in-process twin in simulation — same bytes). Each round:

1. ``configure_train`` picks ``k = ceil(topk_ratio * m)`` over the model's ``m`` floating
   coordinates and a fresh public hash key, and sends the SSA parameters and S1's public key
   with the model; ``topk-count = k`` overrides the clients' ``topk_mod`` setting so every
   client uploads at most ``k`` coordinates (``ssa_mod`` outside ``topk_mod`` on the client).
2. ``aggregate_train`` validates each reply (as :class:`FedSubAvg` does, plus the DPF keys'
   shape), relays the public parts and sealed S1 material to S1, adds the clients S1 accepted
   to its own share, takes S1's share, reconstructs ``sum c*dw`` and ``sum c`` per coordinate
   and applies the count-weighted average — the same result as :class:`FedSubAvg` on the
   plaintext top-k updates, up to the fixed-point error (``clients * 2**-frac_bits`` per
   coordinate before division).

**Threat model and leakage.** Two non-colluding semi-honest servers, semi-honest clients
(:mod:`flwr_fsl.protocols.ssa`). S0 sees each client's public part, its own master seed, the
client's ``num-examples`` (as in FedAvg) and the reconstructed aggregate: per coordinate the
weighted sum and the total weight of the clients that chose it. It does not see which
coordinates a single client chose or their values (unless the round has one client).

**Failures.** A malformed, late, duplicated or unsolicited reply, or one S1 rejects, drops that
client with a logged reason (:attr:`dropped`); the others are aggregated exactly. If S1 cannot
be reached or answers inconsistently, the round fails loudly (logged at ERROR, recorded in
:attr:`failed_rounds`) and the global model is unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.crypto.dpf import DPFKeyBatch, DPFKeyError
from flwr_fsl.helper import HelperConnection, HelperError
from flwr_fsl.mods.ssa_records import (
    HELPER_KEY_FIELD,
    PARAMS_FIELD,
    read_ssa_upload,
)
from flwr_fsl.protocols.ssa import (
    SSAInputError,
    SSAParams,
    SSAServer,
    parse_public_part,
    reconstruct,
)
from flwr_fsl.strategies.fedsubavg import FedSubAvg
from flwr_fsl.submodel import SubmodelFormatError
from flwr_fsl.submodel.layout import FlatLayout


class SecureFedSubAvg(FedSubAvg):
    """Top-k federated submodel averaging through two-server secure aggregation (S0's side).

    Parameters
    ----------
    helper : HelperConnection
        Connection to S1.
    topk_ratio : float
        Fraction in (0, 1] of the model's floating coordinates each client uploads.
    helper_fingerprint : str, optional
        Pinned SHA-256 fingerprint of S1's public key; if given, S0 checks the key S1
        announces against it (clients always check against their own pinned value).
    frac_bits, max_abs : int, float
        Fixed-point format of the payload words ``c * dw`` and ``c`` (``c`` the client's
        ``num-examples``); ``max_abs`` must bound both.
    stash_size, num_hashes : int
        Cuckoo stash size ``σ`` and number of hash functions ``η``.
    **kwargs
        :class:`FedSubAvg` / Flower ``FedAvg`` arguments (fractions, minimum nodes, keys,
        metric aggregation).

    Raises
    ------
    ValueError
        If an argument is out of range.

    Attributes
    ----------
    failed_rounds : dict[int, str]
        Round -> why secure aggregation failed (the model was left unchanged).
    """

    def __init__(
        self,
        helper: HelperConnection,
        topk_ratio: float,
        *,
        helper_fingerprint: str | None = None,
        frac_bits: int = 24,
        max_abs: float = 1e4,
        stash_size: int = 0,
        num_hashes: int = 3,
        **kwargs: Any,
    ) -> None:
        if not 0.0 < topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio must be in (0, 1], got {topk_ratio}")
        super().__init__(**kwargs)
        self.helper = helper
        self.topk_ratio = topk_ratio
        self.helper_fingerprint = helper_fingerprint
        self.frac_bits, self.max_abs = frac_bits, max_abs
        self.stash_size, self.num_hashes = stash_size, num_hashes
        self.failed_rounds: dict[int, str] = {}
        self._params: dict[int, SSAParams] = {}
        self._helper_key: bytes | None = None

    def summary(self) -> None:
        """Log the configuration."""
        super().summary()
        log(INFO, "\t└──> SSA: top-k ratio %s, %s fractional bits", self.topk_ratio, self.frac_bits)

    def _helper_public_key(self) -> bytes:
        if self._helper_key is None:
            key = self.helper.public_key()
            if self.helper_fingerprint:
                verify_fingerprint(key, self.helper_fingerprint)
            self._helper_key = key
        return self._helper_key

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Attach the round's SSA parameters and S1's key to FedAvg's train messages."""
        layout = FlatLayout.of({k: v.numpy() for k, v in arrays.items()})
        if layout.size == 0:
            raise ValueError("the model has no floating tensors to aggregate")
        k = min(layout.size, math.ceil(self.topk_ratio * layout.size))
        params = SSAParams(
            round_id=server_round,
            domain_size=layout.size,
            num_items=k,
            value_width=1,
            hash_key=os.urandom(16),
            count_weighted=True,
            num_hashes=self.num_hashes,
            stash_size=self.stash_size,
            frac_bits=self.frac_bits,
            max_abs=self.max_abs,
            max_summands=max(1, len(list(grid.get_node_ids()))),
        )
        self._params[server_round] = params
        config = ConfigRecord(dict(config))
        config["topk-count"] = k
        config[PARAMS_FIELD] = params.to_bytes()
        config[HELPER_KEY_FIELD] = self._helper_public_key()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, run SSA with S1, apply the count-weighted average."""
        replies = list(replies)
        traffic = self._record_received(server_round, "train", replies)
        params = self._params.pop(server_round)
        dropped = self.dropped.setdefault(server_round, {})
        candidates: dict[int, tuple[bytes, bytes, bytes]] = {}
        contents: dict[int, RecordDict] = {}
        seen: set[int] = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            reason = self._reply_problem(server_round, reply, traffic, seen)
            seen.add(node)
            if reason is None:
                try:
                    self._weight(reply.content)
                    public, seed, sealed = read_ssa_upload(reply.content)
                    DPFKeyBatch.from_master_seed(0, parse_public_part(params, public), seed)
                    candidates[node] = (public, seed, sealed)
                    contents[node] = reply.content
                except (SubmodelFormatError, SSAInputError, DPFKeyError) as err:
                    reason = str(err)
            if reason is not None:
                dropped[node] = reason
                log(WARNING, "aggregate_train: dropping reply from node %s: %s", node, reason)
        if not candidates:
            log(WARNING, "aggregate_train: no valid reply; the global model is unchanged")
            return None, None
        try:
            share1, accepted = self._run_helper(server_round, params, candidates, dropped)
        except HelperError as err:
            self.failed_rounds[server_round] = f"{type(err).__name__}: {err}"
            log(
                ERROR,
                "round %s: secure aggregation with S1 failed (%s); model unchanged",
                server_round,
                err,
            )
            return None, None
        if not accepted:
            return None, None
        server0 = SSAServer(params, 0)
        for node in accepted:
            public, seed, _ = candidates[node]
            server0.add_client(node, public, seed)
        result = reconstruct(params, server0.share(), share1)
        layout = FlatLayout.of(self._global)
        new_flat = layout.flatten(self._global) + result.average()[:, 0]
        new_arrays = layout.unflatten(new_flat, self._global)
        metrics = self.train_metrics_aggr_fn([contents[n] for n in accepted], self.weighted_by_key)
        metrics["down-bytes-per-client"] = self._sent[(server_round, "train")].mean_down_bytes
        metrics["up-bytes-per-client"] = traffic.mean_up_bytes
        assert result.counts is not None
        metrics["touched-fraction"] = float(np.count_nonzero(result.counts)) / layout.size
        log(INFO, "aggregate_train: securely aggregated %d clients", len(accepted))
        return ArrayRecord({k: Array(v) for k, v in new_arrays.items()}), metrics

    def _run_helper(
        self,
        server_round: int,
        params: SSAParams,
        candidates: dict[int, tuple[bytes, bytes, bytes]],
        dropped: dict[int, str],
    ) -> tuple[NDArray[np.uint64], list[int]]:
        self.helper.open_round(server_round, params.to_bytes())
        try:
            rejected = self.helper.add_clients(
                server_round, [(n, pub, sealed) for n, (pub, _, sealed) in candidates.items()]
            )
            for node, reason in rejected.items():
                dropped[node] = f"rejected by S1: {reason}"
                log(WARNING, "aggregate_train: S1 rejected node %s: %s", node, reason)
            accepted = [n for n in candidates if n not in rejected]
            result = self.helper.finish_round(server_round)
        except HelperError:
            try:
                self.helper.abort_round(server_round)
            except HelperError as err:  # S1 may be gone: the round fails either way
                log(WARNING, "could not abort round %s on S1: %s", server_round, err)
            raise
        if sorted(result.client_ids) != sorted(accepted):
            raise HelperError(
                f"S1 aggregated clients {sorted(result.client_ids)}, S0 expected {sorted(accepted)}"
            )
        shape = (params.domain_size, params.tau)
        if result.share.dtype != np.uint64 or result.share.shape != shape:
            raise HelperError(f"S1's share has shape {result.share.shape}, expected {shape}")
        return result.share, accepted
