"""S0's side of a mixed index-mode round: several row tables plus the dense tensors.

:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` hands a round to
:class:`MixedRounds` when its model is described by a
:class:`~flwr_fsl.submodel.tables.ModelTables` with more than one table, or with the dense
tensors federated (:mod:`flwr_fsl.families.ssa.mixed` describes the round and its wire fields).
Per Flower round ``r`` with ``P`` parts, part ``i`` is S1 round ``(r - 1) P + i + 1`` of the run's
session (all ``P`` open at once: S1's ``--max-open-rounds`` must be at least ``P``, 4 by
default):

1. ``query.psr``: one PSR query per table part from each client; S0 answers each and has S1
   answer it, sealed to the client. A client with a malformed or rejected query for any table
   is dropped from the round (the others stay exact).
2. ``train``: each client gets its own answers (one pair per table) and the dense tensors in
   the clear (they are the public global model), trains, and uploads one SSA upload per part.
   A reply missing a part or with a malformed part drops that client.
3. Each part is aggregated with S1 as its own round, released (DP per part) and the model is
   updated by one count-weighted apply over all parts
   (:meth:`~flwr_fsl.families.ssa.aggregation_strategy.TwoServerAggregation.apply_parts`).

**DP accounting.** Each part is clipped by the client to ``clip_norm`` and noised at the
round's ``z`` by each server: ``P`` Gaussian mechanisms per round, which compose in Rényi DP
exactly as one at ``z / sqrt(P)``. S0's account spends that per round
(:meth:`MixedRounds.effective_noise_multiplier`); S1 spends ``z`` once per part, the same total.
So a mixed round costs the budget of ``P`` single-table rounds at the same ``z``.

**U-DPF per table** (``udpf=True``, the default as in single-table rounds): each table part
has its own hash key (:func:`~flwr_fsl.families.ssa.mixed.part_hash_key`), hence its own layout,
and its keys are numbered by the Flower round (epoch ``r``); S0 keeps one key store per table
(``LeadServer.max_layouts``), S1 one per layout (at most ``--max-open-rounds`` per session). Each
client's train message carries, per table, the digest of the keys S0 holds for it
(:data:`~flwr_fsl.families.ssa.mixed.HELD_FIELD`); a client whose rows of a table are unchanged
since its last accepted round sends that table's hint. A hint either server rejects drops that
client from that table's part only (its keys there are forgotten: fresh keys next time); the
dense part always carries fresh one-shot keys.

**Cui's basic protocol** (``union="psu"``): before step 1, one PSU per primary table opens its
union; each derived table's union is its parent's mapped by the public row map; every table
part's PSR and SSA then run over its union's rows and the apply writes them back
(:mod:`flwr_fsl.families.ssa.mixed_union`, :mod:`flwr_fsl.families.ssa.mixed_union_strategy`).
The dense part is unchanged.
U-DPF is not used with ``union="psu"`` (the unions, hence the layouts, change every round).
"""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.core.engine import RoundState
from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.ssa.aggregation_strategy import TwoServerAggregation, read_upload
from flwr_fsl.families.ssa.mixed import (
    ANSWERS0_FIELD,
    ANSWERS1_FIELD,
    DENSE_PART,
    HELD_FIELD,
    MIXED_FIELD,
    MIXED_VERSION,
    PART_PARAMS_FIELD,
    PARTS_FIELD,
    UDPF_FIELD,
    DenseChunks,
    part_hash_key,
    part_key,
)
from flwr_fsl.families.ssa.mixed_union import union_fields
from flwr_fsl.families.ssa.mixed_union_strategy import (
    expand_tables,
    mixed_psu_phase,
    restrict_tables,
)
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.families.ssa.psr import encode_table
from flwr_fsl.families.ssa.records import PSR_QUERY_TYPE, PSR_UPLOAD_KEY, SSA_UPLOAD_KEY
from flwr_fsl.families.ssa.two_server import ClientUpload
from flwr_fsl.submodel.layout import Layout, RowLayout
from flwr_fsl.submodel.tables import ModelTables

if TYPE_CHECKING:
    from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
    from flwr_fsl.families.ssa.union import UnionRound

__all__ = ["MixedRounds"]


class MixedRounds:
    """The mixed-round logic of one :class:`SecureRowFedSubAvg` (S0's side).

    Parameters
    ----------
    tables : ModelTables
        The model's row tables.
    dense : bool
        Federate the dense tensors (every floating tensor that is no table) as one more part.
    dense_width : int or None
        Coordinates per dense element (None: the widest table's row width).
    """

    def __init__(self, tables: ModelTables, dense: bool, dense_width: int | None) -> None:
        self.tables, self.dense, self.dense_width = tables, dense, dense_width
        self._warned: set[str] = set()

    @property
    def num_parts(self) -> int:
        """Parts per round: one per table, plus one for the dense tensors if federated."""
        return len(self.tables.tables) + int(self.dense)

    def effective_noise_multiplier(self, z: float | None) -> float | None:
        """Return the one-mechanism equivalent of ``num_parts`` releases at ``z`` each."""
        return None if z is None else z / math.sqrt(self.num_parts)

    def round_ids(self, server_round: int) -> list[int]:
        """Return S1's round ids of the parts of Flower round ``server_round``."""
        first = (server_round - 1) * self.num_parts + 1
        return list(range(first, first + self.num_parts))

    def layouts(
        self, model: dict[str, Any], unions: dict[str, UnionRound] | None = None
    ) -> list[tuple[str, Layout]]:
        """Return each part's name and element space over ``model`` (tables over ``unions``).

        Raises
        ------
        ConfigurationError
            If the tables do not fit the model (:meth:`ModelTables.check`), a table is not
            float32, or ``dense`` is set and the model has no dense tensor.
        """
        self.tables.check(model)
        out: list[tuple[str, Layout]] = []
        for spec in self.tables.tables:
            if model[spec.name].dtype != np.float32:
                raise ConfigurationError(f"table {spec.name!r} must be a 2-D float32 tensor")
            rows = {spec.name: model[spec.name]}
            if unions is not None:  # union="psu": the table's rows in its union only
                rows = restrict_tables(rows, unions)
            out.append((spec.name, RowLayout.of(rows, spec.name)))
            # A client never holds more rows than a table has (19 genres, not 273).
            bound = self.tables.worst_case_rows(
                spec.name, {n: len(model[n]) for n in self.tables.names}
            )
            if spec.derived and bound > spec.max_rows and spec.name not in self._warned:
                self._warned.add(spec.name)
                log(
                    WARNING,
                    "table %r: a client's derived rows can reach %d > max_rows %d; clients keep "
                    "their %d heaviest rows (raise max_rows to train them all)",
                    spec.name,
                    bound,
                    spec.max_rows,
                    spec.max_rows,
                )
        if self.dense:
            names = self.tables.dense_names(model)
            if not names:
                raise ConfigurationError("dense=True, but the model has no dense tensor")
            width = self.dense_width or max(lay.width for _, lay in out)
            out.append((DENSE_PART, DenseChunks.of(model, names, width)))
        return out

    def round_config(
        self,
        strategy: SecureRowFedSubAvg,
        state: RoundState,
        grid: Grid,
        base: ConfigRecord,
        unions: dict[str, UnionRound] | None = None,
    ) -> tuple[ConfigRecord, list[tuple[str, Layout, SSAParams]]]:
        """Open every part's S1 round; return the round's config and the parts.

        With ``unions`` (``union="psu"``), ``state.model`` holds the full tables and each table
        part runs over its union's rows; the config then carries the unions.
        """
        aggregation: TwoServerAggregation = strategy.aggregation
        parts: list[tuple[str, Layout, SSAParams]] = []
        nodes = max(1, len(list(grid.get_node_ids())))
        for round_id, (name, layout) in zip(
            self.round_ids(state.server_round), self.layouts(state.model, unions), strict=True
        ):
            items, hash_key, epoch = layout.size, strategy.hash_key, 0
            if name != DENSE_PART:
                items = min(self.tables[name].max_rows, layout.size)
                hash_key = part_hash_key(strategy.hash_key, name)
                # U-DPF keys are numbered by the Flower round; one-shot keys (0) are not kept.
                epoch = state.server_round if strategy.udpf else 0
            params = aggregation.round_params(
                grid,
                round_id=round_id,
                domain_size=layout.size,
                num_items=items,
                value_width=layout.width,
                hash_key=hash_key,
                max_summands=nodes,
                epoch=epoch,
            )
            parts.append((name, layout, params))
        out = ConfigRecord(dict(base))
        first: dict[str, Any] = {}
        for i, (_, _, params) in enumerate(parts):
            fields = aggregation.round_fields(params, strategy.weighted_by_key)
            if i == 0:
                first = fields
        for key, value in first.items():
            out[key] = value  # the first part's fields: what find_round and the checks read
        out[MIXED_FIELD] = MIXED_VERSION
        if strategy.udpf:
            out[UDPF_FIELD] = True
        out[PARTS_FIELD] = [name for name, _, _ in parts]
        out[PART_PARAMS_FIELD] = [params.to_bytes() for _, _, params in parts]
        if unions is not None:
            for key, value in union_fields(unions).items():
                out[key] = value
        return out, parts

    def train_round(
        self,
        strategy: SecureRowFedSubAvg,
        grid: Grid,
        state: RoundState,
        arrays: ArrayRecord,
        config: ConfigRecord,
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run retrieval per table, training, and secure aggregation of every part."""
        nodes = strategy.sample(state, grid)
        if not nodes:
            return None, None
        base = strategy.base_round_config(state, arrays, config, grid)
        full, unions = state.model, None
        if strategy.union == "psu":
            unions, nodes = self._open_unions(strategy, grid, state, nodes, base)
            if not nodes:
                return None, None
        round_config, parts = self.round_config(strategy, state, grid, base, unions)
        state.protocol = parts
        state.model = restrict_tables(full, unions)  # union="psu": PSR, SSA over the unions
        lead = strategy.aggregation.lead
        answers = self._retrieve(strategy, grid, state, nodes, round_config, parts)
        names = {name for name, _, _ in parts}
        others = ArrayRecord({k: v for k, v in arrays.items() if k not in names})
        contents: dict[int, RecordDict] = {}
        for node, pairs in answers.items():
            node_config = ConfigRecord(dict(round_config))
            node_config[ANSWERS0_FIELD] = [a0 for a0, _ in pairs]
            node_config[ANSWERS1_FIELD] = [a1 for _, a1 in pairs]
            if strategy.udpf:  # per table, the keys S0 holds for this client (b"": none)
                held = [lead.held(node, p) for n, _, p in parts if n != DENSE_PART]
                node_config[HELD_FIELD] = [h or b"" for h in held]
            contents[node] = RecordDict(
                {strategy.arrayrecord_key: others, strategy.configrecord_key: node_config}
            )
        log(
            INFO,
            "train_round: %d of %d sampled nodes retrieved their rows",
            len(contents),
            len(nodes),
        )

        def parse(node: int, content: RecordDict) -> list[ClientUpload]:
            out = []
            for i, (name, _, params) in enumerate(parts):
                try:
                    upload = read_upload(content, part_key(SSA_UPLOAD_KEY, i))
                    hints = strategy.udpf and name != DENSE_PART
                    lead.check_upload(params, node, upload, accept_hints=hints)
                except ClientInputError as err:
                    raise ClientInputError(f"part {name!r}: {err}") from None
                out.append(upload)
            return out

        messages = strategy.prepare(state, "train", contents, MessageType.TRAIN)
        del contents
        uploads = dict(strategy.stream(grid, state, "train", messages, parse))
        aggregated = [
            (params, {n: u[i] for n, u in uploads.items()}, layout)
            for i, (_, layout, params) in enumerate(parts)
        ]
        out = strategy.aggregation.apply_parts(state, aggregated, strategy.train_metrics)
        if out == (None, None):
            self.abort(strategy, state)
        else:
            expand_tables(full, unions, out[0])
        return out

    def _open_unions(
        self,
        strategy: SecureRowFedSubAvg,
        grid: Grid,
        state: RoundState,
        nodes: list[int],
        base: ConfigRecord,
    ) -> tuple[dict[str, UnionRound], list[int]]:
        """Phase 0 of ``union="psu"``: one PSU per primary table, derived unions by the map."""
        self.layouts(state.model)  # check the tables before any message
        rids = self.round_ids(state.server_round)
        return mixed_psu_phase(strategy, self.tables, grid, state, nodes, base, rids)

    @staticmethod
    def _retrieve(
        strategy: SecureRowFedSubAvg,
        grid: Grid,
        state: RoundState,
        nodes: list[int],
        round_config: ConfigRecord,
        parts: list[tuple[str, Layout, SSAParams]],
    ) -> dict[int, list[tuple[bytes, bytes]]]:
        """Phase 1: every table's PSR queries, answered by S0 and S1 (sealed to the client)."""
        lead = strategy.aggregation.lead
        tables = [(i, name, p) for i, (name, _, p) in enumerate(parts) if name != DENSE_PART]

        def parse_queries(_node: int, content: RecordDict) -> list[ClientUpload]:
            return [read_upload(content, part_key(PSR_UPLOAD_KEY, i)) for i, _, _ in tables]

        query = RecordDict({strategy.configrecord_key: round_config})
        queries = strategy.send(
            grid,
            state,
            "psr",
            dict.fromkeys(nodes, query),
            PSR_QUERY_TYPE,
            parse=parse_queries,
            timeout=strategy.psr_timeout,
        )
        answers: dict[int, list[tuple[bytes, bytes]]] = {node: [] for node in queries}
        for j, (_, name, params) in enumerate(tables):
            asked = {n: q[j] for n, q in queries.items() if n in answers}
            if not asked:
                break
            words = encode_table(state.model[name])
            for node, answer in lead.answer_queries(params, words, asked).items():
                if isinstance(answer, str):
                    state.drop(node, f"retrieval of {name!r}: {answer}")
                    answers.pop(node, None)
                else:
                    answers[node].append(answer)
        return answers

    def abort(self, strategy: SecureRowFedSubAvg, state: RoundState) -> None:
        """Release every part's round on S1."""
        strategy.aggregation.abort(state, self.round_ids(state.server_round))
