r"""``PerturbedRows``: the client side of :class:`~flwr_fsl.strategies.SFSLFedSubAvg`.

Usage, around an unchanged ``@app.train`` that trains the model it receives::

    rows = PerturbedRows("item_emb.weight", rows=my_rows, rr=RRParams.symmetric(15/16, 1/16))
    app = ClientApp(mods=[rows.mod])

``rows(context)`` returns the client's real row set ``S`` and a count per row (how many of its
samples touch it). The mod owns the SecAgg instances ``"union"`` and ``"rows"``
(:data:`SFSL_INSTANCES`): it answers their control phases
(:func:`~flwr_fsl.families.secagg.mod.secagg_control`) and:

* ``union`` train phase: its randomized Bloom filter of ``S`` (:func:`~flwr_fsl.families.sfsl.psu.
  client_vector`), or with DP its noisy row indicator
  (:func:`~flwr_fsl.families.sfsl.dp.noisy_union_vector`), masked;
* ``perturb``: ``S''`` over the union by randomized response, with the permanent answers kept
  for the client's lifetime (below);
* ``rows`` train phase: runs your train function on the model with only the rows of ``S''``
  (others zero), then uploads, masked, ``(v_j Δ_j, v_j)`` for ``j in S'' ∩ S``, zero for
  ``S'' \ S``, and ``(w Δ, w)`` for the dense tensors — with DP clipped, count-scaled and
  with its noise on every word (:func:`~flwr_fsl.families.sfsl.dp.noisy_rows_vector`).

**What the client checks** (a refused round drops this client with one line naming the check):
the round's noise multiplier (0 for the paper's noiseless protocol) must be at least the
client's floor — ``noise_floor=`` if given, else the node config's ``fsl-min-noise-multiplier``
(:data:`~flwr_fsl.core.privacy.NODE_MIN_NOISE_KEY`), else the family default 1.0: a default
client refuses the paper's rounds (``SFSLFedSubAvg(dp=None)``) until its operator lowers the
floor. A weighted round (``weighted=True``) may use as weight only ``num-examples`` or a metric
the node config's ``fsl-weight-keys`` allows.

**Memo lifetime.** ``ε∞`` bounds what the server learns from one memo of permanent answers,
however many rounds use it — so the memo must live as long as the client. By default it is
kept on disk under the node's state folder, ``$FLWR_HOME/fsl/sfsl-memo/node-<node id>.rr``
(``FLWR_HOME`` defaults to ``~/.flwr``, as in Flower; the node config's ``fsl-sfsl-memo-dir``
or ``memo_dir=`` names another folder), so a new run of the same SuperNode reuses its answers
and ``ε∞`` holds across runs. A SuperNode's node id follows its public key, so it is stable
across restarts of a deployed node; in a simulation node ids are fresh per run, so there the
scope is the run. A memo records the ``p1, p2`` it was drawn with and a client refuses other
ones for it; a corrupted memo file is an error, never a fresh start. ``persist_memo=False``
keeps the memo in ``Context.state`` only (one run: ``ε∞`` then holds per run, not per client).

SecAgg messages of other instances (``"model"``: :class:`~flwr_fsl.strategies.SecAggFedAvg`)
pass through, so ``ClientApp(mods=[rows.mod, secagg_mod])`` serves both strategies.

**Per-training settings.** The perturb message carries the round's train config (under
``config_key``, ``"config"`` as in Flower). ``rr`` may be a function
``rr(config, context) -> RRParams`` of it, so the server can ask for a privacy level per
training (and a client can still choose its own from its ``node_config``). With
``session_key``, the config entry of that name scopes the memo: each value has its own
permanent answers (its own ``Context.state`` slot and memo file), so the answers of one
training never reach another. Within one scope the permanent probabilities ``p1, p2`` may not
change (the memo was drawn with them; ``ε∞`` assumes them); ``p3, p4`` may.

Note what scoping costs: ``ε∞`` bounds what the server learns from *one* memo however many
rounds use it. Trainings with separate scopes draw independent permanent answers, so a server
that sees ``k`` of them of the same client gets up to ``k·ε∞``. Scope by session only where
the trainings must be independent (e.g. an experiment comparing privacy levels); a deployment
that wants the lifetime bound keeps one scope (no ``session_key``).

**Several tables** (:mod:`flwr_fsl.families.sfsl.tables`). Give ``table`` a
:class:`~flwr_fsl.submodel.tables.ModelTables` (the same public spec as the strategy's) and
let ``rows(context)`` return ``{primary table: (rows, counts)}`` (or ``{table: rows}``, counts
1; a bare ``(rows, counts)`` still means the only primary table). The client's union input and
its perturbed answer hold its *primary* rows only (each table cut to its ``max_rows``, the rows
of largest count); the server derives the derived tables' ``S''`` from the perturbed primary
rows by the public maps, and the client checks that it did. The train function sees the
unpacked model (every table at its own shape, rows outside ``S''`` zero).

Error texts name checks, never rows, counts or values.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase, PhaseMod
from flwr_fsl.core.privacy import (
    check_noise_floor,
    check_weight_key,
    node_noise_floor,
)
from flwr_fsl.core.state import StateSlot
from flwr_fsl.families.secagg.mod import (
    keep_client,
    load_client,
    on_advertise,
    on_share,
    on_unmask,
)
from flwr_fsl.families.secagg.records import (
    ADVERTISE,
    SECAGG_KEY,
    SHARE,
    UNMASK,
    MaskedInputReply,
    record_instance,
)
from flwr_fsl.families.sfsl.dp import DEFAULT_NOISE_MULTIPLIER, RowsRound, rows_input, union_input
from flwr_fsl.families.sfsl.messages import SFSLSettings, expand_download
from flwr_fsl.families.sfsl.perturb import MemoStore, PermanentMemo, RRParams, perturb_index_set
from flwr_fsl.families.sfsl.records import (
    PERTURB,
    ROWS_INSTANCE,
    ROWS_TRAIN,
    SFSL_INSTANCES,
    UNION_INSTANCE,
    UNION_TRAIN,
    PerturbReply,
    PerturbRequest,
    RowsInputRequest,
    UnionInputRequest,
)
from flwr_fsl.families.sfsl.tables import TablePacking
from flwr_fsl.submodel.tables import ModelTables

__all__ = [
    "NODE_MEMO_DIR_KEY",
    "ROWS_INSTANCE",
    "SFSL_INSTANCES",
    "UNION_INSTANCE",
    "PerturbedRows",
    "RRChoice",
    "default_memo_dir",
]

RowsFn = Callable[[Context], Any]
"""``rows(context)``: ``(rows, counts)``; several tables: ``{primary table: (rows, counts)}``."""
RRChoice = Callable[[ConfigRecord, Context], RRParams]
"""``rr(config, context)``: the randomized-response parameters of one training."""
Session = str | bytes | int


MEMO_SLOT = "fsl.sfsl.memo"
_RR_SLOT = "fsl.sfsl.rr"  # per memo slot: the (p1, p2) its permanent answers were drawn with
_TABLES_SLOT = "fsl.sfsl.tables"  # several tables: the round's packed name (union -> perturb)
NODE_MEMO_DIR_KEY = "fsl-sfsl-memo-dir"
"""Node-config key: the folder of this node's randomized-response memos (module docstring)."""


def default_memo_dir(node_config: Mapping[str, object]) -> Path:
    """Return the folder of a node's memos: ``fsl-sfsl-memo-dir``, else under ``FLWR_HOME``.

    Raises
    ------
    ConfigurationError
        If the node config's value is not a non-empty string.
    """
    raw = node_config.get(NODE_MEMO_DIR_KEY)
    if raw is not None:
        if not isinstance(raw, str) or not raw:
            raise ConfigurationError(f"node config {NODE_MEMO_DIR_KEY} must be a folder path")
        return Path(raw).expanduser()
    home = Path(os.environ.get("FLWR_HOME", "~/.flwr")).expanduser()
    return home / "fsl" / "sfsl-memo"


def _scope(session: Session | None) -> str:
    """Return the suffix naming a session's memo ('' for the unscoped one)."""
    if session is None:
        return ""
    if isinstance(session, bytes):
        raw = session
    elif isinstance(session, str):
        raw = session.encode()
    else:
        raw = str(int(session)).encode()
    return hashlib.sha256(b"flwr_fsl.sfsl.memo\x00" + raw).hexdigest()[:32]


def _memo_slot(scope: str) -> StateSlot[PermanentMemo]:
    name = f"{MEMO_SLOT}.{scope}" if scope else MEMO_SLOT
    return StateSlot(name, PermanentMemo.to_bytes, PermanentMemo.from_bytes)


@dataclass
class PerturbedRows:
    """Client mod of Niu et al.'s secure federated submodel learning for one row table.

    Parameters
    ----------
    table : str or ModelTables
        The row table's name in the model, or the model's tables (module docstring).
    rows : Callable[[Context], object]
        The real row set ``S`` and a positive count per row; with several tables a mapping
        ``{primary table: (rows, counts) or rows}``.
    rr : RRParams or Callable[[ConfigRecord, Context], RRParams]
        This client's randomized-response probabilities ``p1..p4``, or a function of the
        perturb message's train config and the node's context that returns them.
    memo_dir : str or Path, optional
        Where to keep the permanent answers (one file per node and scope); default
        :func:`default_memo_dir` (module docstring).
    persist_memo : bool
        True (default): keep the memo on disk for the client's lifetime; False: in
        ``Context.state`` only (``ε∞`` then holds per run).
    noise_floor : float, optional
        The smallest noise multiplier this client accepts; default the node config's
        ``fsl-min-noise-multiplier``, else 1.0 (the family default).
    session_key : str, optional
        A train-config entry whose value scopes the memo (module docstring). A perturb
        message whose config lacks it is refused.
    config_key : str
        The train config's record name (the strategy's ``configrecord_key``). Default
        ``"config"``.

    Raises
    ------
    ConfigurationError
        If a setting is invalid.
    """

    table: str | ModelTables
    rows: RowsFn
    rr: RRParams | RRChoice
    memo_dir: str | Path | None = None
    session_key: str | None = None
    config_key: str = "config"
    persist_memo: bool = True
    noise_floor: float | None = None

    instances: ClassVar[tuple[str, ...]] = SFSL_INSTANCES

    def __post_init__(self) -> None:
        if not isinstance(self.table, ModelTables) and (
            not isinstance(self.table, str) or not self.table
        ):
            raise ConfigurationError(
                "PerturbedRows: table must name the model's row table or be ModelTables"
            )
        if not callable(self.rows):
            raise ConfigurationError("PerturbedRows: rows must be a function of the Context")
        if not isinstance(self.rr, RRParams) and not callable(self.rr):
            raise ConfigurationError(
                "PerturbedRows: rr must be RRParams or a function (config, context) -> RRParams"
            )
        if self.session_key is not None and (
            not isinstance(self.session_key, str) or not self.session_key
        ):
            raise ConfigurationError("PerturbedRows: session_key must be a non-empty str or None")
        if not isinstance(self.config_key, str) or not self.config_key:
            raise ConfigurationError("PerturbedRows: config_key must be a non-empty str")
        if not isinstance(self.persist_memo, bool):
            raise ConfigurationError("PerturbedRows: persist_memo must be a bool")
        if self.noise_floor is not None:
            node_noise_floor({}, self.noise_floor)  # a number >= 0, or ConfigurationError

    def _floor(self, context: Context) -> float:
        if self.noise_floor is not None:
            return float(self.noise_floor)
        return node_noise_floor(context.node_config, DEFAULT_NOISE_MULTIPLIER)

    def _check_round(self, settings: SFSLSettings, context: Context) -> None:
        """Refuse a round below this client's noise floor or with a weight key it disallows."""
        try:
            check_noise_floor(settings.noise_multiplier, self._floor(context), what="SFSL")
            if settings.weighted:
                check_weight_key(settings.weight_key, context.node_config)
        except ConfigurationError as err:
            raise ClientInputError(str(err)) from err

    def _packing(self, name: str) -> TablePacking | None:
        """Return the round's packing (several tables), None for one table; check the name."""
        if isinstance(self.table, ModelTables):
            return TablePacking.from_name(name, self.table)
        if name != self.table:
            raise ClientInputError("the SFSL settings name another row table")
        return None

    def _primary(
        self, context: Context, packing: TablePacking
    ) -> dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]]:
        value = self.rows(context)
        if not isinstance(value, Mapping):
            if len(packing.tables.primary) != 1:
                raise ConfigurationError(
                    "rows(context) must return {primary table: rows} with several primary tables"
                )
            value = {packing.tables.primary[0]: value}
        return packing.primary_rows(value)

    def _virtual(
        self, context: Context, packing: TablePacking | None
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Return the real rows of the union and perturb phases (primary, virtual, sorted)."""
        if packing is None:
            return self._real(context)
        primary = self._primary(context, packing)
        rows = packing.to_virtual({n: r for n, (r, _) in primary.items()})
        return rows, np.ones(rows.size)

    def _real(self, context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        rows, counts = self.rows(context)
        r = np.asarray(rows, dtype=np.int64)
        c = np.asarray(counts, dtype=np.float64)
        if r.shape != c.shape or r.ndim != 1 or np.unique(r).size != r.size:
            raise ConfigurationError(
                "rows(context) must return distinct rows and one count per row"
            )
        order = np.argsort(r)
        return r[order], c[order]

    def _store(self, context: Context, scope: str) -> MemoStore | None:
        if not self.persist_memo:
            return None
        folder = (
            Path(self.memo_dir) if self.memo_dir is not None
            else default_memo_dir(context.node_config)
        )  # fmt: skip
        name = f"node-{int(context.node_id)}" + (f".{scope}" if scope else "")
        return MemoStore(folder / f"{name}.rr")

    def memo(self, context: Context, session: Session | None = None) -> PermanentMemo | None:
        """Return the permanent answers this node keeps for ``session`` (None: no scope).

        Reads the memo file (``persist_memo``), else ``Context.state``; None when there is no
        memo yet.
        """
        scope = _scope(session)
        store = self._store(context, scope)
        if store is not None:
            return store.load() if store.path.exists() else None
        return _memo_slot(scope).load(context)

    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Run the mod (see the module docstring).

        Raises
        ------
        ClientInputError
            If a message of the ``union`` / ``rows`` instances is malformed, has an unknown
            phase or does not fit this client's state, or a SecAgg record names no valid
            instance (the server drops this client from the round).
        """
        union, rows = _UnionMod(self), _RowsMod(self)
        return union(msg, context, lambda m, c: rows(m, c, call_next))

    def _config(self, beside: RecordDict) -> ConfigRecord:
        config = beside.config_records.get(self.config_key)
        if config is None:
            raise ClientInputError(
                f"the perturb message carries no train config {self.config_key!r}"
            )
        return config

    def _rr(self, beside: RecordDict, context: Context) -> RRParams:
        if isinstance(self.rr, RRParams):
            return self.rr
        try:
            params = self.rr(self._config(beside), context)
        except ClientInputError:
            raise
        except (KeyError, TypeError, ValueError) as err:
            raise ClientInputError(f"rr(config, context) refused the train config: {err}") from err
        if not isinstance(params, RRParams):
            raise TypeError("rr(config, context) must return RRParams")
        return params

    def _session(self, beside: RecordDict) -> Session | None:
        if self.session_key is None:
            return None
        value = self._config(beside).get(self.session_key)
        if value is None:
            raise ClientInputError(f"the train config lacks the session key {self.session_key!r}")
        if isinstance(value, bool) or not isinstance(value, str | bytes | int):
            raise ClientInputError(
                f"the session key {self.session_key!r} is not a str, bytes or int"
            )
        return value

    def on_union(self, request: UnionInputRequest, context: Context) -> MaskedInputReply:
        """PSU: this client's randomized Bloom filter of ``S``, masked."""
        client = load_client(context, UNION_INSTANCE, request.params)
        settings = request.settings
        assert settings.psu is not None  # the request's parser checked it
        self._check_round(settings, context)
        packing = self._packing(settings.table)
        if packing is not None:  # the perturb phase has no settings: keep the round's name
            context.state[_TABLES_SLOT] = ConfigRecord({"name": settings.table})
        real, _ = self._virtual(context, packing)
        vector = union_input(
            settings.psu, real, settings.dp, settings.frac_bits, request.params.threshold
        )
        masked = client.masked_input(request.sharers, vector)
        keep_client(context, UNION_INSTANCE, client)
        return MaskedInputReply(masked)

    def on_perturb(self, request: PerturbRequest, context: Context) -> PerturbReply:
        """Alg. 2: ``S''`` over the union, the permanent answers kept per memo scope."""
        rr = self._rr(request.beside, context)
        scope = _scope(self._session(request.beside))
        slot = _memo_slot(scope)
        drawn = context.state.config_records.get(_RR_SLOT, ConfigRecord())
        permanent = [rr.p1, rr.p2]
        if slot.name in drawn and drawn.get(slot.name) != permanent:
            raise ClientInputError(
                "the permanent probabilities p1, p2 changed within one memo scope "
                "(its answers were drawn with others; use a new session)"
            )
        packing, union = self._perturb_domain(request.union, context)
        real, _ = self._virtual(context, packing)
        store = self._store(context, scope)
        memo = store.load() if store is not None else (slot.load(context) or PermanentMemo())
        perturbed, memo = perturb_index_set(real, union, memo, rr)
        slot.store(context, memo)
        drawn[slot.name] = permanent
        context.state[_RR_SLOT] = drawn
        if store is not None:
            store.save(memo)
        return PerturbReply(perturbed)

    def _perturb_domain(
        self, union: NDArray[np.int64], context: Context
    ) -> tuple[TablePacking | None, NDArray[np.int64]]:
        """Several tables: the round's packing and the union's primary rows (else the union)."""
        if not isinstance(self.table, ModelTables):
            return None, union
        record = context.state.config_records.get(_TABLES_SLOT)
        name = None if record is None else record.get("name")
        if not isinstance(name, str):
            raise ClientInputError("a perturb message before the round's union phase")
        packing = TablePacking.from_name(name, self.table)
        return packing, union[packing.primary_mask(union)]

    def on_rows(
        self, request: RowsInputRequest, context: Context, train: Callable[..., Message]
    ) -> MaskedInputReply | Message:
        """Alg. 1: run the user's train function on ``S''``, mask ``(v Δ, v)`` and ``(w Δ, w)``."""
        client = load_client(context, ROWS_INSTANCE, request.params)
        settings = request.settings
        packing = self._packing(settings.table)
        table = settings.table
        self._check_round(settings, context)
        records = request.beside.array_records
        if len(records) != 1 or table not in next(iter(records.values())):
            raise ClientInputError("the SFSL train message must carry the model with its table")
        key, download = next(iter(records.items()))
        assert settings.psu is not None  # the request's parser checked it
        if packing is not None:
            if packing.rows != settings.psu.domain_size:
                raise ClientInputError("the SFSL round's domain is not its tables' rows")
            packing.check_extended(request.rows)
        # The message holds the rows of S'' only; the train function sees the full table.
        model = expand_download(
            {k: a.numpy() for k, a in download.items()},
            table,
            request.rows,
            settings.psu.domain_size,
        )
        dense_size = sum(v.size for k, v in model.items() if k != table)
        layout, length = settings.layout(request.union, int(model[table].shape[1]), dense_size)
        if length != request.params.vector_length:
            raise ClientInputError("the SFSL layout does not match the round's length")
        shown = model if packing is None else packing.unpack(model)
        reply = train({key: ArrayRecord({k: Array(np.asarray(v)) for k, v in shown.items()})})
        if reply.has_error():
            return reply  # masks of a client that drops are removed in Unmask
        trained_records = list(reply.content.array_records.values())
        metric_records = list(reply.content.metric_records.values())
        if len(trained_records) != 1 or len(metric_records) != 1:
            raise ClientInputError("the train reply must hold one ArrayRecord and one MetricRecord")
        trained = {k: a.numpy() for k, a in trained_records[0].items()}
        if packing is None:
            rows, counts = self._real(context)
        else:
            trained = packing.pack(trained)
            rows, counts = packing.real_rows(self._primary(context, packing))
        weight = 1.0
        if settings.weighted:
            value = metric_records[0].get(settings.weight_key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ClientInputError(f"the train reply lacks a positive {settings.weight_key!r}")
            weight = float(value)
        else:
            counts = np.ones(rows.size)
        peers = RowsRound(
            table, settings.clip, settings.dp, request.params.threshold,
            len(request.sharers), request.shared, settings.max_count,
        )  # fmt: skip
        vector, positions = rows_input(
            layout, peers, request.rows, model, trained, weight, (rows, counts), length
        )
        masked = client.masked_input(
            request.sharers, vector, rows=positions, shared_rows=request.shared
        )
        keep_client(context, ROWS_INSTANCE, client)
        return MaskedInputReply(masked)


class _InstanceMod(PhaseMod):
    """One SFSL SecAgg instance as a phase mod (SecAgg's control phases and SFSL's own)."""

    family: ClassVar[str] = SECAGG_KEY
    title: ClassVar[str] = "SFSL"
    instance: ClassVar[str]

    def __init__(self, owner: PerturbedRows) -> None:
        self.owner = owner

    def owns(self, content: RecordDict) -> bool:
        """Only this instance's messages (a malformed ``instance`` is refused)."""
        return record_instance(content.config_records[SECAGG_KEY]) == self.instance

    on_advertise = staticmethod(on_advertise)
    on_share = staticmethod(on_share)
    on_unmask = staticmethod(on_unmask)


def _phases(*phases: Phase[Any, Any]) -> Mapping[str, Phase[Any, Any]]:
    return {p.name: p for p in phases}


class _UnionMod(_InstanceMod):
    instance: ClassVar[str] = UNION_INSTANCE
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = _phases(ADVERTISE, SHARE, UNION_TRAIN, UNMASK)

    def on_train(self, request: UnionInputRequest, context: Context) -> MaskedInputReply:
        return self.owner.on_union(request, context)


class _RowsMod(_InstanceMod):
    instance: ClassVar[str] = ROWS_INSTANCE
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = _phases(
        ADVERTISE, SHARE, PERTURB, ROWS_TRAIN, UNMASK
    )

    def on_perturb(self, request: PerturbRequest, context: Context) -> PerturbReply:
        return self.owner.on_perturb(request, context)

    def on_train(
        self, request: RowsInputRequest, context: Context, train: Callable[..., Message]
    ) -> MaskedInputReply | Message:
        return self.owner.on_rows(request, context, train)
