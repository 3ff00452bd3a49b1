"""What S0's strategies share: the S1 connection, reply validation and the SSA round with S1.

:class:`SecureFedSubAvg` (top-k mode) and :class:`SecureRowFedSubAvg` (index mode) differ in
what a client's elements are (flat coordinates vs. table rows) and in the retrieval phase; the
secure aggregation itself — validate uploads, relay to S1, add the accepted clients to S0's
share, check both servers aggregated the same clients, reconstruct — is this one class.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from logging import ERROR, WARNING
from typing import Any

from flwr.app import Message, MetricRecord, RecordDict
from flwr.supercore import log

from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.crypto.dpf import DPFKeyBatch, DPFKeyError
from flwr_fsl.helper import HelperConnection, HelperError
from flwr_fsl.protocols.ssa import (
    SSAInputError,
    SSAParams,
    SSAResult,
    SSAServer,
    parse_public_part,
    reconstruct,
)
from flwr_fsl.records import read_hint_upload, read_ssa_upload
from flwr_fsl.strategies.fedsubavg import FedSubAvg
from flwr_fsl.submodel import SubmodelFormatError


@dataclass
class _Uploads:
    """A round's valid uploads: fresh keys, U-DPF hints, and the reply contents."""

    fresh: dict[int, tuple[bytes, bytes, bytes]]
    hints: dict[int, bytes]
    contents: dict[int, RecordDict]


class TwoServerStrategy(FedSubAvg):
    """Base of S0's strategies: Flower ``FedAvg`` knobs plus the two-server SSA machinery.

    Parameters
    ----------
    helper : HelperConnection
        Connection to S1.
    helper_fingerprint : str, optional
        Pinned fingerprint of S1's public key, checked by S0 (clients check their own).
    frac_bits, max_abs : int, float
        Fixed-point format of the payload words (``max_abs`` bounds ``c * dw`` and ``c``).
    stash_size, num_hashes : int
        Cuckoo stash size and number of hash functions.
    **kwargs
        :class:`FedSubAvg` / Flower ``FedAvg`` arguments.

    Attributes
    ----------
    failed_rounds : dict[int, str]
        Round -> why secure aggregation failed (the model was left unchanged).
    """

    def __init__(
        self,
        helper: HelperConnection,
        *,
        helper_fingerprint: str | None = None,
        frac_bits: int = 24,
        max_abs: float = 1e4,
        stash_size: int = 0,
        num_hashes: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.helper = helper
        self.helper_fingerprint = helper_fingerprint
        self.frac_bits, self.max_abs = frac_bits, max_abs
        self.stash_size, self.num_hashes = stash_size, num_hashes
        self.failed_rounds: dict[int, str] = {}
        self._params: dict[int, SSAParams] = {}
        self._stored_keys: dict[int, DPFKeyBatch] = {}
        self._helper_key: bytes | None = None

    def _helper_public_key(self) -> bytes:
        if self._helper_key is None:
            key = self.helper.public_key()
            if self.helper_fingerprint:
                verify_fingerprint(key, self.helper_fingerprint)
            self._helper_key = key
        return self._helper_key

    def _collect_uploads(
        self, server_round: int, params: SSAParams, replies: list[Message], accept_hints: bool
    ) -> _Uploads:
        """Validate replies as FedSubAvg does plus the keys' shape; drop the bad ones."""
        traffic = self._record_received(server_round, "train", replies)
        dropped = self.dropped.setdefault(server_round, {})
        uploads = _Uploads({}, {}, {})
        seen: set[int] = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            reason = self._reply_problem(server_round, reply, traffic, seen)
            seen.add(node)
            if reason is None:
                try:
                    self._weight(reply.content)
                    hint = read_hint_upload(reply.content)
                    if hint is not None:
                        if not accept_hints or node not in self._stored_keys:
                            raise SSAInputError("U-DPF hint without stored keys")
                        uploads.hints[node] = hint
                    else:
                        public, seed, sealed = read_ssa_upload(reply.content)
                        DPFKeyBatch.from_master_seed(0, parse_public_part(params, public), seed)
                        uploads.fresh[node] = (public, seed, sealed)
                    uploads.contents[node] = reply.content
                except (SubmodelFormatError, SSAInputError, DPFKeyError) as err:
                    reason = str(err)
            if reason is not None:
                dropped[node] = reason
                log(WARNING, "aggregate_train: dropping reply from node %s: %s", node, reason)
        return uploads

    def _secure_aggregate(
        self, server_round: int, params: SSAParams, uploads: _Uploads
    ) -> tuple[SSAResult, list[int]] | None:
        """Run the round's SSA with S1 (which must have the round open); None if it failed.

        S1 goes first; S0 adds exactly the clients S1 accepted and checks S1's client list,
        so both shares cover the same clients.
        """
        dropped = self.dropped.setdefault(server_round, {})
        try:
            rejected: dict[int, str] = {}
            if uploads.fresh:
                rejected.update(
                    self.helper.add_clients(
                        server_round,
                        [(n, pub, sealed) for n, (pub, _, sealed) in uploads.fresh.items()],
                    )
                )
            if uploads.hints:
                rejected.update(self.helper.add_client_hints(server_round, uploads.hints.items()))
            server0 = SSAServer(params, 0, previous_keys=self._stored_keys)
            accepted: list[int] = []
            for node in uploads.contents:
                if node in rejected:
                    dropped[node] = f"rejected by S1: {rejected[node]}"
                    log(WARNING, "aggregate_train: S1 rejected node %s: %s", node, rejected[node])
                    continue
                try:
                    if node in uploads.hints:
                        server0.add_client_hint(node, uploads.hints[node])
                    else:
                        server0.add_client(node, *uploads.fresh[node][:2])
                except SSAInputError as err:
                    raise HelperError(f"S0 rejected node {node} that S1 accepted: {err}") from err
                accepted.append(node)
            share1 = self.helper.finish_round(server_round)
            if sorted(share1.client_ids) != sorted(accepted):
                raise HelperError(
                    f"S1 aggregated clients {sorted(share1.client_ids)}, S0 {sorted(accepted)}"
                )
            shape = (params.domain_size, params.tau)
            if share1.share.shape != shape:
                raise HelperError(f"S1's share has shape {share1.share.shape}, expected {shape}")
        except HelperError as err:
            self._fail(server_round, err)
            return None
        if not accepted:
            return None
        self._stored_keys.update(server0.keys)
        return reconstruct(params, server0.share(), share1.share), accepted

    def _round_metrics(
        self, server_round: int, accepted: Iterable[int], uploads: _Uploads, touched: float
    ) -> MetricRecord:
        accepted = list(accepted)
        metrics = self.train_metrics_aggr_fn(
            [uploads.contents[n] for n in accepted], self.weighted_by_key
        )
        traffic = self._sent[(server_round, "train")]
        metrics["down-bytes-per-client"] = traffic.mean_down_bytes
        metrics["up-bytes-per-client"] = traffic.mean_up_bytes
        metrics["touched-fraction"] = touched
        metrics["udpf-clients"] = sum(1 for n in accepted if n in uploads.hints)
        return metrics

    def _fail(self, server_round: int, err: Exception) -> None:
        self.failed_rounds[server_round] = f"{type(err).__name__}: {err}"
        log(
            ERROR,
            "round %s: secure aggregation with S1 failed (%s); model unchanged",
            server_round,
            err,
        )
        self._abort(server_round)

    def _abort(self, server_round: int) -> None:
        try:
            self.helper.abort_round(server_round)
        except HelperError as err:  # not open on S1, or S1 gone: nothing to release
            log(WARNING, "could not abort round %s on S1: %s", server_round, err)
