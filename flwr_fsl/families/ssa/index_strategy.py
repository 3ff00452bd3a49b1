"""``SecureRowFedSubAvg``: index-mode FSL — private retrieval and secure aggregation of rows.

A client's submodel is the set of rows of one table (embedding rows of the items in its data).
Each round, S0 (this strategy) and S1 (the helper) run, per sampled client:

1. **PSR** (``query.psr`` message, before training): the client sends PSR keys;
   S0 answers them itself and has S1 answer them (sealed to the client); the train message
   carries both answers, never the table.
2. **Training and SSA**: the client trains on its rows and uploads the row deltas as
   mega-elements (``width + 1`` words with the count word) through SSA, or — when its row set
   is unchanged since its last round — a U-DPF hint that moves both servers' stored keys.
3. Both servers reconstruct per row ``sum c*dw`` and ``sum c`` and applies the
   count-weighted average to the table; rows nobody touched keep their value.

The hash key is drawn once per run (U-DPF keys stay valid across rounds only under the same
hashing); the row-set size ``max_rows`` is public. With one table named by a string, tensors
other than the table are not federated (clients may keep personal parameters, e.g. user
embeddings, locally): they stay as in the initial model.

**Several tables and dense layers** (``table=ModelTables(...)``,
:mod:`flwr_fsl.submodel.tables`): each table is its own part with its own ``max_rows``, PSR
retrieval and row SSA; a derived table's rows are computed by the client from its primary rows
with the public row map and retrieved and aggregated the same way; the dense tensors (every
other floating tensor) are one more part, aggregated through the same S1 session as dense SSA
(``dense=True``, the default with ``ModelTables``). One count-weighted apply updates all
parts. :mod:`flwr_fsl.families.ssa.mixed_strategy` runs these rounds (U-DPF per table; each part
spends the privacy budget of one round).

**Cui's basic protocol** (``union="psu"``): a ``query.psu`` phase first opens the union ``U``
of the clients' rows (a two-server private set union,
:mod:`flwr_fsl.families.ssa.union_strategy`), then PSR and SSA run over ``U``'s rows only. In a
mixed round there is one PSU per primary table, each derived table's union is its parent's
mapped by the public row map, and the dense part is unchanged
(:mod:`flwr_fsl.families.ssa.mixed_union`). It reveals each ``U`` exactly to both servers and
every client each round, even with DP on (clients answer it only with node config
``fsl-allow-union = true``).

**Threat model and leakage.** Two non-colluding semi-honest servers, semi-honest clients.
Neither server learns which rows a client retrieves or updates, nor its row values; both see
public parameters and the reconstructed aggregate (per row the weighted sum and total weight
of the clients that updated it: by default, ``weighted=False``, the number of clients; replies
carry no weight in the clear, and rounds with fewer than ``min_clients`` accepted clients are
not reconstructed). Federated evaluation is off by default and needs
``plaintext_evaluation=True`` (its replies are in the clear). S0 sees S1's PSR answers only
sealed to the client. A U-DPF hint instead of fresh keys tells both servers that the client's
row set is unchanged since its last accepted round. Because a client's rows are fixed by its
data, exact per-row totals over rounds of changing participation would give every client's row
set by least squares; so DP noise is on by default here (``dp``, ``privacy_budget``: each
server noises its share, the run stops at its budget, S1 keeps its own account of the run and
clients refuse rounds below their noise floor; :mod:`flwr_fsl.families.ssa.dp`).

**Failures.** A client whose query, keys or hint are malformed, or that S1 rejects, is dropped
with a reason (:attr:`dropped`); the others stay exact. If S1 fails, the round fails loudly
(:attr:`failed_rounds`) and the table is unchanged.
"""

from __future__ import annotations

import os
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from flwr_fsl.core.checks import check_bool, check_int, check_real, check_str
from flwr_fsl.core.engine import MultiPhaseStrategy, RoundState
from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.families.ssa.aggregation_strategy import (
    SSASettings,
    TwoServerAggregation,
    check_helper,
    read_upload,
    secure_flower_kwargs,
)
from flwr_fsl.families.ssa.dp import DEFAULT_BUDGET, INDEX_MODE_DP, DistributedDP
from flwr_fsl.families.ssa.mixed_strategy import MixedRounds
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.families.ssa.psr import encode_table
from flwr_fsl.families.ssa.records import (
    ANSWER0_FIELD,
    ANSWER1_FIELD,
    PSR_QUERY_TYPE,
    PSR_UPLOAD_KEY,
    TABLE_FIELD,
    UDPF_FIELD,
    UDPF_HELD_FIELD,
)
from flwr_fsl.families.ssa.union import check_union_option
from flwr_fsl.families.ssa.union_strategy import apply_over_union, psu_phase, union_fields
from flwr_fsl.families.topk.strategy import FedSubAvg
from flwr_fsl.helper import HelperConnection
from flwr_fsl.submodel.layout import RowLayout
from flwr_fsl.submodel.tables import ModelTables, TableSpec


class SecureRowFedSubAvg(MultiPhaseStrategy, FedSubAvg):
    """Index-mode federated submodel averaging of one row table (S0's side).

    A round is three phases: ``query.psr`` (retrieval) → ``train`` (per-client messages
    carrying that client's answers) → secure aggregation with S1.

    Parameters
    ----------
    helper : HelperConnection
        Connection to S1.
    table : str or ModelTables
        Name of the row table (a float32 2-D tensor) in the model's ``ArrayRecord``, or the
        model's row tables (:class:`~flwr_fsl.submodel.tables.ModelTables`: several tables, each
        with its own ``max_rows``, derived tables with their public row maps).
    max_rows : int, optional
        Public bound ``k`` on a client's row-set size (with a table name; with ``ModelTables``
        each table carries its own and this must be None).
    dense : bool, optional
        Federate the dense tensors (every floating tensor that is not a table) through the same
        two-server round. Default: False with a table name (the single-table behaviour: other
        tensors stay as initialised, e.g. personal parameters), True with ``ModelTables`` (a
        model of tables plus layers trains as a whole).
    dense_width : int, optional
        Coordinates per dense element (default: the widest table's row width); each element
        carries one count word, which under DP adds to the sensitivity.
    udpf : bool, optional
        Accept U-DPF hints (clients send them when their row set is unchanged). Default True
        (with ``union="off"``); in a mixed round per table (each table's keys stored apart on
        both servers; the dense part always fresh keys).
    psr_timeout : float
        Seconds to wait for the retrieval replies.
    helper_fingerprint : str, optional
        Pinned fingerprint of S1's public key, checked by S0 (clients check their own).
    frac_bits, max_abs, stash_size, num_hashes, min_clients : int, float, int, int, int
        :class:`~flwr_fsl.families.ssa.aggregation_strategy.SSASettings` (``min_clients``: minimum
        participation, default 2; a round with fewer accepted clients fails unreconstructed).
    dp : DistributedDP or None
        Distributed differential privacy (``SSASettings.dp``, :mod:`flwr_fsl.families.ssa.dp`):
        clients clip, S0 and S1 each noise their share, ``(ε, δ)`` logged per round. **On by
        default** (:data:`~flwr_fsl.families.ssa.dp.INDEX_MODE_DP`: ``z = 1``, clip norm 1,
        weights clipped to 1): a client's rows are fixed by its data, and exact per-row counts
        over rounds of changing participation decode who holds which row
        (``tests/attacks/test_ssa_index_row_least_squares.py``). ``None`` turns it off (that
        leak returns; the clients must also lower their node-config floor
        ``fsl-min-noise-multiplier`` to 0, or they refuse every round). Start S1 with the
        matching ``flwr-fsl-helper --dp-*`` flags so S1 enforces its own noise.
    privacy_budget : PrivacyBudget or None
        The run's budget (default :data:`~flwr_fsl.families.ssa.dp.DEFAULT_BUDGET`, ``ε = 20``
        at ``δ = 1e-5``: 10 rounds at ``z = 1``): the run stops before a round that would
        exceed it; S1 refuses such rounds too. None: account without stopping.
    weighted : bool
        False (default): every row a client updates counts 1. True: weighted by the clients'
        per-row counts (``PrivateRows(rows=...)``) or ``weighted_by_key`` (with DP, clipped to
        ``dp.max_weight``); S0 then reconstructs sums of those weights per row.
    plaintext_evaluation : bool
        Allow federated evaluation (``fraction_evaluate > 0``), whose replies give S0 every
        evaluated client's metrics and ``num-examples`` in the clear. Default False.
    value_check : str
        How both servers check every client's value words (``SSASettings.value_check``,
        ``SSAParams.value_check``): ``"projected"`` (default; random projections, every value
        word within ``2T = 8 sqrt(k w) * max_abs`` in fixed point, a few thousand upload words,
        :mod:`flwr_fsl.families.ssa.projected_check`), ``"exact"`` (every word within
        ``max_abs``; ``8 * L`` upload bytes per value word per key, 2-3x the upload,
        :mod:`flwr_fsl.families.ssa.range_check`) or ``"off"`` (unchecked).
    union : str
        ``"off"`` (default) or ``"psu"``: Cui's basic protocol, a private set union of the
        clients' rows before PSR, then PSR and SSA over the union only (no U-DPF; mixed
        rounds: one PSU per primary table, derived tables' unions by their row maps, the dense
        part unchanged). **Leaks** the exact union of every round's rows to both servers and
        every client, even with DP on (``tests/attacks/test_ssa_psu_union_difference.py``).
    **kwargs
        Flower ``FedAvg`` arguments and ``sampling_seed``; ``fraction_evaluate`` defaults to
        0.0.

    Raises
    ------
    ConfigurationError
        If ``max_rows`` < 1 or another argument is out of range, ``max_rows`` is given with
        ``ModelTables`` or missing with a table name, ``fraction_evaluate > 0``
        without ``plaintext_evaluation=True``, ``weighted_by_key`` is given without
        ``weighted=True``, or ``union`` is not ``"off"``/``"psu"`` (``"psu"``: not with
        ``udpf=True``).
    """

    PHASES = ("query.psr", "train")

    def __init__(  # noqa: PLR0913
        self,
        helper: HelperConnection,
        table: str | ModelTables,
        max_rows: int | None = None,
        *,
        dense: bool | None = None,
        dense_width: int | None = None,
        udpf: bool | None = None,
        psr_timeout: float = 3600.0,
        helper_fingerprint: str | None = None,
        frac_bits: int = 24,
        max_abs: float = 1e4,
        stash_size: int = 0,
        num_hashes: int = 3,
        min_clients: int = 2,
        dp: DistributedDP | None = INDEX_MODE_DP,
        privacy_budget: PrivacyBudget | None = DEFAULT_BUDGET,
        weighted: bool = False,
        plaintext_evaluation: bool = False,
        value_check: str = "projected",
        union: str = "off",
        **kwargs: Any,
    ) -> None:
        check_helper(helper, helper_fingerprint)
        self.union = check_union_option(union)
        tables, dense = _tables(table, max_rows, dense)
        if dense_width is not None:
            check_int("dense_width", dense_width, 1)
        self.mixed = (
            None
            if len(tables.tables) == 1 and not dense
            else MixedRounds(tables, dense, dense_width)
        )
        if udpf is None:
            udpf = union == "off"
        check_bool("udpf", udpf)
        if udpf and union == "psu":
            raise ConfigurationError("udpf: U-DPF keys need the same domain every round, not psu")
        check_real("psr_timeout", psr_timeout, 0.0, low_open=True)
        kwargs = secure_flower_kwargs(type(self).__name__, weighted, plaintext_evaluation, kwargs)
        super().__init__(**kwargs)
        self.tables = tables
        self.table, self.max_rows = tables.tables[0].name, tables.tables[0].max_rows
        self.udpf, self.psr_timeout = udpf, psr_timeout
        settings = SSASettings(
            frac_bits,
            max_abs,
            stash_size,
            num_hashes,
            min_clients,
            dp,
            privacy_budget,
            weighted=weighted,
            value_check=value_check,
        )
        self.aggregation = TwoServerAggregation(helper, helper_fingerprint, settings)
        if self.mixed is not None:  # S0 keeps one U-DPF key store per table
            self.aggregation.lead.max_layouts = len(tables.tables)
        self.privacy_account = self.aggregation.privacy_account
        self._hash_key = os.urandom(16)  # once per run: U-DPF keys need unchanged hashing

    @property
    def hash_key(self) -> bytes:
        """The run's cuckoo hash key (drawn once per run)."""
        return self._hash_key

    def base_round_config(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> ConfigRecord:
        """Return ``FedSubAvg``'s round config (the fields every round carries)."""
        return super().round_config(state, arrays, config, grid)

    def round_config(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> ConfigRecord:
        """Return the round's config: SSA parameters (row table), S1's key, table name, U-DPF."""
        table = state.model[self.table]
        if table.ndim != 2 or table.dtype != np.float32:
            raise ConfigurationError(f"table {self.table!r} must be a 2-D float32 tensor")
        params = self.aggregation.round_params(
            grid,
            round_id=state.server_round,
            domain_size=table.shape[0],
            num_items=min(self.max_rows, table.shape[0]),
            value_width=table.shape[1],
            hash_key=self._hash_key,
            max_summands=max(1, len(list(grid.get_node_ids()))),
            # U-DPF rounds number their keys' epochs; one-shot keys (epoch 0) are not kept.
            epoch=state.server_round if self.udpf else 0,
        )
        state.protocol = params
        out = super().round_config(state, arrays, config, grid)
        out[TABLE_FIELD] = self.table
        out[UDPF_FIELD] = self.udpf
        for key, value in self.aggregation.round_fields(params, self.weighted_by_key).items():
            out[key] = value
        return out

    def start(self, *args: Any, **kwargs: Any) -> Result:
        """Run as ``PhasedStrategy.start``, in an S1 session of this run's own.

        Several strategies may share one connection to S1 (:meth:`TwoServerAggregation.own_session
        <flwr_fsl.families.ssa.aggregation_strategy.TwoServerAggregation.own_session>`).
        """
        self.aggregation.new_run()
        return super().start(*args, **kwargs)

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run retrieval (PSR), training on each client's rows, secure aggregation of rows."""
        self.aggregation.own_session()  # before the PSU or PSR phase asks S1 anything
        state.model = {name: array.numpy() for name, array in arrays.items()}
        if self.mixed is not None:
            return self.mixed.train_round(self, grid, state, arrays, config)
        if self.table not in state.model:
            raise ConfigurationError(f"the model has no tensor {self.table!r}")
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        union, full = None, state.model[self.table]
        if self.union == "psu":
            base = self.base_round_config(state, arrays, config, grid)
            union, nodes = psu_phase(self, grid, state, nodes, base)
            if union.size == 0 or not nodes:
                return None, None
            state.model = {**state.model, self.table: full[union.union]}  # PSR, SSA over U
        round_config = self.round_config(state, arrays, config, grid)
        if union is not None:
            round_config.update(union_fields(union))
        params: SSAParams = state.protocol
        lead = self.aggregation.lead

        # Phase 1: each client's PSR query; S0 answers, S1's answer is sealed to the client.
        query = RecordDict({self.configrecord_key: round_config})
        queries = self.send(
            grid,
            state,
            "psr",
            dict.fromkeys(nodes, query),
            PSR_QUERY_TYPE,
            parse=lambda _n, c: read_upload(c, PSR_UPLOAD_KEY),
            timeout=self.psr_timeout,
        )
        table_words = encode_table(state.model[self.table])
        answers = lead.answer_queries(params, table_words, queries) if queries else {}

        # Phase 2: train, a different message per client (its own answers).
        others = ArrayRecord({k: v for k, v in arrays.items() if k != self.table})
        contents: dict[int, RecordDict] = {}
        for node, answer in answers.items():
            if isinstance(answer, str):
                state.drop(node, f"retrieval: {answer}")
                continue
            node_config = ConfigRecord(dict(round_config))
            node_config[ANSWER0_FIELD], node_config[ANSWER1_FIELD] = answer
            held = lead.held(node) if self.udpf else None
            if held is not None:
                node_config[UDPF_HELD_FIELD] = held
            contents[node] = RecordDict(
                {self.arrayrecord_key: others, self.configrecord_key: node_config}
            )
        log(
            INFO,
            "train_round: %d of %d sampled nodes retrieved their rows",
            len(contents),
            len(nodes),
        )
        parse = self.aggregation.parser(params, accept_hints=self.udpf)
        messages = self.prepare(state, "train", contents, MessageType.TRAIN)
        del contents
        # Streamed: S0 relays and evaluates the uploads chunk by chunk as they arrive.
        uploads = self.stream(grid, state, "train", messages, parse)

        # Phase 3: secure aggregation with S1.
        layout = RowLayout.of(state.model, self.table)
        result = self.aggregation.apply(state, params, uploads, layout, self.train_metrics)
        return result if union is None else apply_over_union(self.table, full, union, result)

    def round_noise_multiplier(self) -> float | None:
        """Each server's noise multiplier of every round (None: DP off, no noise).

        A mixed round releases one Gaussian mechanism per part at ``z`` each: its one-round
        equivalent ``z / sqrt(parts)`` is what the account spends.
        """
        z = self.aggregation.noise_multiplier()
        return z if self.mixed is None else self.mixed.effective_noise_multiplier(z)

    def describe_privacy(self) -> str:
        """One line: the run's ``(ε, δ)`` against each server (a mixed round's parts named)."""
        return self.aggregation.describe_privacy(1 if self.mixed is None else self.mixed.num_parts)

    def round_minimum(self, sampled: int) -> tuple[int, str]:
        """Return ``min_clients``, checked before round 1."""
        return self.aggregation.round_minimum()

    def privacy_stop_reason(self) -> str | None:
        """S1's refusal of a round past its own account of this run (the run then stops)."""
        return self.aggregation.helper_refusal

    def round_failed(self, state: RoundState, error: Exception) -> None:
        """Release the round on S1 (every part's round in a mixed round)."""
        if self.mixed is not None:
            self.mixed.abort(self, state)
        else:
            self.aggregation.abort(state)


def _tables(
    table: str | ModelTables, max_rows: int | None, dense: bool | None
) -> tuple[ModelTables, bool]:
    """Return the model's tables and whether dense tensors are federated (see the class)."""
    if isinstance(table, ModelTables):
        if max_rows is not None:
            raise ConfigurationError(
                "max_rows: with ModelTables each TableSpec carries its own max_rows"
            )
        return table, True if dense is None else check_bool("dense", dense)
    check_str("table", table)
    if max_rows is None:
        raise ConfigurationError("max_rows: give the public bound on a client's rows")
    check_int("max_rows", max_rows, 1)
    return ModelTables((TableSpec(table, max_rows),)), bool(
        False if dense is None else check_bool("dense", dense)
    )
