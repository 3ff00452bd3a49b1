"""``SecureRowFedSubAvg``: index-mode FSL — private retrieval and secure aggregation of rows.

A client's submodel is the set of rows of one table (embedding rows of the items in its data).
Each round, S0 (this strategy) and S1 (the helper) run, per sampled client:

1. **PSR** (``query.psr`` message, inside ``configure_train``): the client sends PSR keys;
   S0 answers them itself and has S1 answer them (sealed to the client); the train message
   carries both answers, never the table.
2. **Training and SSA**: the client trains on its rows and uploads the row deltas as
   mega-elements (``width + 1`` words with the count word) through SSA, or — when its row set
   is unchanged since its last round — a U-DPF hint that moves both servers' stored keys.
3. ``aggregate_train`` reconstructs per row ``sum c*dw`` and ``sum c`` and applies the
   count-weighted average to the table; rows nobody touched keep their value.

The hash key is drawn once per run (U-DPF keys stay valid across rounds only under the same
hashing); the row-set size ``max_rows`` is public. Tensors other than the table are not
federated in this mode (clients may keep personal parameters, e.g. user embeddings, locally):
they stay as in the initial model.

**Threat model and leakage.** Two non-colluding semi-honest servers, semi-honest clients.
Neither server learns which rows a client retrieves or updates, nor its row values; both see
public parameters, the clients' ``num-examples`` and the reconstructed aggregate (per row the
weighted sum and total weight of the clients that updated it — with one client in a round, that
client's row set). S0 sees S1's PSR answers only sealed to the client.

**Failures.** A client whose query, keys or hint are malformed, or that S1 rejects, is dropped
with a reason (:attr:`dropped`); the others stay exact. If S1 fails, the round fails loudly
(:attr:`failed_rounds`) and the table is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.helper import HelperConnection, HelperError
from flwr_fsl.protocols.psr import PSRServer, encode_table
from flwr_fsl.protocols.ssa import (
    SSAInputError,
    SSAParams,
)
from flwr_fsl.records import (
    ANSWER0_FIELD,
    ANSWER1_FIELD,
    HELPER_KEY_FIELD,
    PARAMS_FIELD,
    PSR_QUERY_TYPE,
    PSR_UPLOAD_KEY,
    SESSION_FIELD,
    TABLE_FIELD,
    UDPF_FIELD,
    read_ssa_upload,
)
from flwr_fsl.strategies.fedsubavg import _tag_round
from flwr_fsl.strategies.two_server import TwoServerStrategy
from flwr_fsl.submodel import SubmodelFormatError
from flwr_fsl.traffic import RoundTraffic, content_bytes


class SecureRowFedSubAvg(TwoServerStrategy):
    """Index-mode federated submodel averaging of one row table (S0's side).

    Parameters
    ----------
    helper : HelperConnection
        Connection to S1.
    table : str
        Name of the row table (a float32 2-D tensor) in the model's ``ArrayRecord``.
    max_rows : int
        Public bound ``k`` on a client's row-set size.
    udpf : bool
        Accept U-DPF hints (clients send them when their row set is unchanged).
    psr_timeout : float
        Seconds to wait for the retrieval replies.
    **kwargs
        :class:`~flwr_fsl.strategies.two_server.TwoServerStrategy` settings
        (``helper_fingerprint``, ``frac_bits``, ``max_abs``, ``stash_size``, ``num_hashes``) and
        Flower ``FedAvg`` arguments.

    Raises
    ------
    ValueError
        If ``max_rows`` < 1 or another argument is out of range.
    """

    def __init__(
        self,
        helper: HelperConnection,
        table: str,
        max_rows: int,
        *,
        udpf: bool = True,
        psr_timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        super().__init__(helper, **kwargs)
        self.table, self.max_rows = table, max_rows
        self.udpf, self.psr_timeout = udpf, psr_timeout
        self._hash_key = os.urandom(16)  # once per run: U-DPF keys need unchanged hashing

    def _round_params(self, server_round: int, table: NDArray[np.generic], nodes: int) -> SSAParams:
        if table.ndim != 2 or table.dtype != np.float32:
            raise ValueError(f"table {self.table!r} must be a 2-D float32 tensor")
        return SSAParams(
            round_id=server_round,
            domain_size=table.shape[0],
            num_items=min(self.max_rows, table.shape[0]),
            value_width=table.shape[1],
            hash_key=self._hash_key,
            count_weighted=True,
            num_hashes=self.num_hashes,
            stash_size=self.stash_size,
            frac_bits=self.frac_bits,
            max_abs=self.max_abs,
            max_summands=max(1, nodes),
            epoch=server_round,
        )

    # -- retrieval + train messages ---------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Run the PSR phase with the sampled clients, then build their train messages."""
        if self.fraction_train == 0.0:
            return []
        self._global = {name: array.numpy() for name, array in arrays.items()}
        if self.table not in self._global:
            raise ValueError(f"the model has no tensor {self.table!r}")
        all_nodes = list(grid.get_node_ids())
        sample_size = max(int(len(all_nodes) * self.fraction_train), self.min_train_nodes)
        node_ids, _ = sample_nodes(grid, self.min_available_nodes, sample_size)
        params = self._round_params(server_round, self._global[self.table], len(all_nodes))
        self._params[server_round] = params
        dropped = self.dropped.setdefault(server_round, {})
        round_config = ConfigRecord(
            {
                **dict(config),
                "server-round": server_round,
                PARAMS_FIELD: params.to_bytes(),
                HELPER_KEY_FIELD: self._helper_public_key(),
                SESSION_FIELD: self.helper.session_id,
                TABLE_FIELD: self.table,
                UDPF_FIELD: self.udpf,
            }
        )
        queries = [
            Message(
                RecordDict({self.configrecord_key: round_config}),
                dst_node_id=node,
                message_type=PSR_QUERY_TYPE,
                group_id=str(server_round),
            )
            for node in node_ids
        ]
        traffic = RoundTraffic(server_round, "psr")
        self.traffic.append(traffic)
        for q in queries:
            traffic.down_bytes[q.metadata.dst_node_id] = content_bytes(q.content)
        replies = list(grid.send_and_receive(queries, timeout=self.psr_timeout))
        table_words = encode_table(self._global[self.table])
        answers0: dict[int, bytes] = {}
        relay: list[tuple[int, bytes, bytes]] = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_content():
                traffic.up_bytes[node] = content_bytes(reply.content)
            try:
                reason = self._query_problem(server_round, reply, node_ids, answers0)
                if reason is None:
                    public, seed, sealed = read_ssa_upload(reply.content, PSR_UPLOAD_KEY)
                    answer = PSRServer(params, 0, table_words).answer(public, seed)
                    answers0[node] = answer.tobytes()
                    relay.append((node, public, sealed))
            except (SubmodelFormatError, SSAInputError) as err:
                reason = str(err)
            if reason is not None:
                dropped[node] = f"retrieval: {reason}"
                log(WARNING, "configure_train: dropping node %s: %s", node, dropped[node])
        answers1: dict[int, bytes | str] = {}
        if relay:
            try:
                self.helper.open_round(server_round, params.to_bytes())
                self.helper.set_model(server_round, table_words)
                answers1 = self.helper.psr_answer(server_round, relay)
            except HelperError as err:
                self._fail(server_round, err)
                return []
        messages = []
        for node, answer1 in answers1.items():
            if isinstance(answer1, str):
                dropped[node] = f"retrieval rejected by S1: {answer1}"
                continue
            node_config = ConfigRecord(dict(round_config))
            node_config[ANSWER0_FIELD] = answers0[node]
            node_config[ANSWER1_FIELD] = answer1
            others = ArrayRecord({k: v for k, v in arrays.items() if k != self.table})
            messages.append(
                Message(
                    RecordDict({self.arrayrecord_key: others, self.configrecord_key: node_config}),
                    dst_node_id=node,
                    message_type=MessageType.TRAIN,
                )
            )
        _tag_round(messages, server_round)
        self._record_sent(server_round, "train", messages)
        log(
            INFO,
            "configure_train: %d of %d sampled nodes retrieved their rows",
            len(messages),
            len(node_ids),
        )
        if not messages and relay:
            self._abort(server_round)
        return messages

    def _query_problem(
        self, server_round: int, reply: Message, node_ids: list[int], done: dict[int, bytes]
    ) -> str | None:
        if reply.has_error():
            return f"client error: {reply.error.reason}"
        if reply.metadata.group_id != str(server_round):
            return "late reply"
        node = reply.metadata.src_node_id
        if node not in node_ids:
            return "reply from a node that was not sampled"
        if node in done:
            return "second reply from the same node"
        return None

    # -- aggregation ------------------------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run SSA over the row updates (fresh keys or U-DPF hints) and update the table."""
        params = self._params.pop(server_round, None)
        if params is None:  # the retrieval phase failed: no round is open on S1
            return None, None
        uploads = self._collect_uploads(server_round, params, list(replies), self.udpf)
        if not uploads.contents:
            self._abort(server_round)
            log(WARNING, "aggregate_train: no valid reply; the table is unchanged")
            return None, None
        outcome = self._secure_aggregate(server_round, params, uploads)
        if outcome is None:
            return None, None
        result, accepted = outcome
        table = self._global[self.table]
        new_arrays = dict(self._global)
        new_arrays[self.table] = (table.astype(np.float64) + result.average()).astype(table.dtype)
        assert result.counts is not None
        metrics = self._round_metrics(
            server_round, accepted, uploads, float(np.count_nonzero(result.counts)) / table.shape[0]
        )
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new_arrays.items()}), metrics
