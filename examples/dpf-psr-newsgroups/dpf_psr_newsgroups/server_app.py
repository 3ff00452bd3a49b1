"""dpf-psr-newsgroups: the ServerApp — S0 of private retrieval and secure aggregation of words.

The ServerApp trains a bag-of-embeddings text classifier (a word table and a dense classifier
head) with :class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` (index mode, Cui et
al. §4–§6, a mixed round): every round each client retrieves the rows of its words with
two-server PSR, trains, and uploads the row deltas as mega-elements (``dim`` values and a count
word) through SSA, and the head's delta as the dense part of the same two-server round. S1 is a
running
``flwr-fsl-helper`` when ``ssa-helper-address`` is set, else an in-process twin (as in
``examples/dpf-psr-movielens``).

With ``compare-plaintext = true`` it also trains plaintext :class:`~flwr_fsl.strategies.FedSubAvg`
(the whole model down, the same rows' deltas and the head up) from the same model and client
sample
(:class:`flwr_fsl.experiment.Experiment`) and prints the harness's tables (test accuracy,
bytes per client per round, time), what each party learns, the largest difference between the
final tables, then this app's two sections: **bytes per client and round** of the secure run,
the plaintext row-sparse run and a dense upload of the whole model (what ``FedAvg`` would send,
sized with :func:`flwr_fsl.core.traffic.content_bytes`), and **what S0 saw** — in plaintext, each
client's word set (recorded from the replies it decoded); under SSA, only the per-row sums.

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`; the tests
call it with :class:`~flwr_fsl.testing.InProcessGrid`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp
from numpy.typing import NDArray

from dpf_psr_newsgroups.task import (
    HEAD,
    TABLE,
    Settings,
    Shape,
    evaluate,
    initial_model,
    model_tables,
    table_shape,
    test_documents,
)
from flwr_fsl.core.engine import RoundState
from flwr_fsl.core.traffic import content_bytes
from flwr_fsl.data import load_newsgroups
from flwr_fsl.experiment import (
    Arm,
    ArmRecord,
    Experiment,
    ExperimentResult,
    Metric,
    sampling_kwargs,
)
from flwr_fsl.families.ssa.dp import dp_options
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import HelperConnection, secure_helper
from flwr_fsl.strategies import FedSubAvg

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)
LOSS = Metric("test loss", "loss", digits=4)
SECURE_LEARNS = {
    "S0": "per row the round's sum and how many clients used it (no count, no word set); "
    "the head's sum over the round's clients",
    "S1": "the round's public parameters and pseudorandom key material",
}
WEIGHTED_LEARNS = {
    **SECURE_LEARNS,
    "S0": "per row the round's weighted sum and the sum of the clients' counts (ssa-weighted)",
}
PLAIN_LEARNS = {"server": "each client's word set (its rows), per-word counts and deltas"}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the secure training (and the plaintext comparison); print and save the results."""
    run_experiment(grid, context.run_config)


class ObservedFedSubAvg(FedSubAvg):
    """Plaintext ``FedSubAvg`` that keeps what the server read: each client's row ids.

    Parameters
    ----------
    unit_weights : bool
        Average as the secure arm does by default: every client counts 1 in each row it sent
        (the counts are still read and recorded, as a plaintext server would).
    **kwargs
        ``FedSubAvg``'s arguments.

    Attributes
    ----------
    seen_rows : dict[int, dict[int, numpy.ndarray]]
        Round -> node -> the row ids of the table in the node's accepted reply.
    seen_counts : dict[int, dict[int, numpy.ndarray]]
        Round -> node -> the counts the reply sent with those rows.
    """

    def __init__(self, *, unit_weights: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unit_weights = unit_weights
        self.seen_rows: dict[int, dict[int, NDArray[np.int64]]] = {}
        self.seen_counts: dict[int, dict[int, NDArray[np.float64]]] = {}

    def receive(
        self,
        state: RoundState,
        phase: str,
        replies: Iterable[Message],
        parse: Callable[[int, RecordDict], Any] | None = None,
        *,
        shrink: bool = True,
    ) -> dict[int, Any]:
        """Validate as ``FedSubAvg`` does; record the row ids of every accepted update."""
        valid = super().receive(state, phase, replies, parse, shrink=shrink)
        if phase == "train":
            seen = self.seen_rows.setdefault(state.server_round, {})
            counts = self.seen_counts.setdefault(state.server_round, {})
            for node, (update, _) in valid.items():
                part = update.tensors.get(TABLE)
                if part is not None and part.indices is not None:
                    seen[node] = np.array(part.indices, np.int64)
                    if part.counts is not None:
                        counts[node] = np.array(part.counts, np.float64)
            if self.unit_weights:  # every client counts 1, as in the secure arm
                for node, (update, content) in valid.items():
                    tensors = {k: replace(t, counts=None) for k, t in update.tensors.items()}
                    valid[node] = (replace(update, tensors=tensors, weight=1.0), content)
        return valid


def dense_bytes(model: Mapping[str, NDArray[np.float32]]) -> tuple[int, int]:
    """Return the wire bytes of a dense round per client: the whole model down and up.

    Down is a train message (the model and a round config), up a ``FedAvg`` reply (the
    trained model and its two metrics), both sized as Flower encodes them.
    """
    arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    config = ConfigRecord({"server-round": 1})
    metrics = MetricRecord({"train-loss": 0.0, "num-examples": 1})
    down = content_bytes(RecordDict({"arrays": arrays, "config": config}))
    up = content_bytes(RecordDict({"arrays": arrays, "metrics": metrics}))
    return down, up


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def bytes_table(
    secure: ArmRecord, plain: ArmRecord | None, dense: tuple[int, int]
) -> dict[str, Any]:
    """Print and return bytes per client per round: SSA/PSR, plaintext row-sparse, dense."""
    rows: list[tuple[str, float | None, float | None]] = [
        ("secure: PSR + SSA (round 1)", *_first_round(secure)),
        ("secure: mean over the rounds", secure.mean("up_bytes"), secure.mean("down_bytes")),
    ]
    if plain is not None:
        rows.append(("plaintext: row-sparse up, table down", *_means(plain)))
    rows.append(("dense FedAvg: the whole model both ways", float(dense[1]), float(dense[0])))
    print(
        f"\n{'bytes per client and round':<42}  {'up B':>12}  {'down B':>12}  "
        f"{'up vs dense':>11}  {'down vs dense':>13}",
        flush=True,
    )
    out = {}
    for label, up, down in rows:
        up_share = "n/a" if up is None else f"{up / dense[1]:.1%}"
        down_share = "n/a" if down is None else f"{down / dense[0]:.1%}"
        print(
            f"{label:<42}  {_fmt(up):>12}  {_fmt(down):>12}  {up_share:>11}  {down_share:>13}",
            flush=True,
        )
        out[label] = {"up_bytes": up, "down_bytes": down}
    return out


def _means(record: ArmRecord) -> tuple[float | None, float | None]:
    return record.mean("up_bytes"), record.mean("down_bytes")


def _first_round(record: ArmRecord) -> tuple[float | None, float | None]:
    first = record.rounds[0] if record.rounds else None
    return (first.up_bytes, first.down_bytes) if first is not None else (None, None)


def _telling_words(
    seen: Mapping[int, NDArray[np.int64]],
    strategy: ObservedFedSubAvg,
    node: int,
    shape: Shape,
    vocab: tuple[str, ...],
) -> str:
    """Describe one client's word set as S0 reads it: size and its most telling words.

    Telling = used in many of the client's documents (the count it sent) but rare overall
    (word id = frequency rank, so ``count * (1 + id)`` is about the client's frequency over
    the corpus's): the top 8 — what S0 itself can compute.
    """
    rows = seen[node]
    words = rows < shape.num_words
    counts = strategy.seen_counts.get(1, {}).get(node, np.ones(rows.size))
    ids = rows[words]
    score = counts[words] * (1.0 + ids)
    top = ids[np.argsort(-score, kind="stable")[:8]]
    return f"{ids.size:,} words, e.g. " + ", ".join(vocab[int(w)] for w in top)


def s0_view(result: ExperimentResult, shape: Shape, initial: NDArray[np.float32]) -> dict[str, Any]:
    """Print and return what S0 saw of the clients' word sets, in plaintext and under SSA."""
    vocab = load_newsgroups().vocab
    out: dict[str, Any] = {}
    print("\nwhat S0 saw of the clients' words:", flush=True)
    plain = next((run for run in result.runs if run.arm.key == "plaintext"), None)
    if plain is not None and isinstance(plain.strategy, ObservedFedSubAvg):
        seen = plain.strategy.seen_rows.get(1, {})
        sizes = [int(np.count_nonzero(r < shape.num_words)) for r in seen.values()]
        print(
            f"  plaintext  round 1: every client's word set — {len(seen)} sets of "
            f"{min(sizes, default=0):,}-{max(sizes, default=0):,} words; for example:",
            flush=True,
        )
        for node in sorted(seen)[:3]:
            text = _telling_words(seen, plain.strategy, node, shape, vocab)
            print(f"             node {node}: {text}", flush=True)
        out["plaintext_sets"] = {str(n): len(r) for n, r in seen.items()}
    secure = result.arm("secure")
    touched = np.any(secure.arrays[TABLE] != initial, axis=1)
    print(
        f"  secure     every round: per row the sum and how many of the round's clients used it "
        f"— over the run {int(touched.sum()):,} of {shape.num_words:,} word rows "
        "(the union) changed; no client's word set, count or delta",
        flush=True,
    )
    out["secure_union_rows"] = int(touched.sum())
    return out


def privacy_line(result: ExperimentResult) -> str:
    """Print and return the secure arm's ``(ε, δ)`` (or that it added no noise)."""
    strategy = result.arm("secure").strategy
    assert isinstance(strategy, SecureRowFedSubAvg)
    line = strategy.describe_privacy()
    print(f"\nsecure arm, {line}", flush=True)
    return line


def run_experiment(
    grid: Grid, run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> ExperimentResult:
    """Train through PSR + SSA and, with ``compare-plaintext``, in plaintext; print and save.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).
    helper : HelperConnection, optional
        S1 to use instead of the one the run config names (its key must still match the
        clients' pin); not closed here.

    Returns
    -------
    ExperimentResult
        Arms ``"secure"`` and (with ``compare-plaintext``) ``"plaintext"``; the record's
        ``extra`` holds the bytes table and what S0 saw.

    Raises
    ------
    ExperimentFailedError
        If an arm aggregated no client update in any round (e.g. every client failed).
    """
    settings = Settings.from_run_config(run_config)
    with secure_helper(run_config, helper) as (connection, fingerprint):
        knobs = sampling_kwargs(settings)
        compare = settings.compare_plaintext
        shape = table_shape(settings)
        model = initial_model(settings)
        test = test_documents(settings)

        def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            loss, accuracy = evaluate(arrays[TABLE].numpy(), arrays[HEAD].numpy(), test, shape)
            return MetricRecord({"accuracy": accuracy, "loss": loss})

        description = (
            f"table {shape.num_words:,} words x {settings.dim} + dense head "
            f"{shape.num_classes} x {settings.dim}, max-rows {settings.max_rows}"
        )
        arms = [
            Arm(
                "secure",
                "secure (PSR+SSA)",
                lambda setup: SecureRowFedSubAvg(
                    connection,
                    model_tables(settings),  # the word table; the head is dense (dense=True)
                    helper_fingerprint=fingerprint,
                    frac_bits=settings.ssa_frac_bits,
                    max_abs=settings.ssa_max_abs,
                    weighted=settings.ssa_weighted,
                    **dp_options(
                        settings.ssa_dp_noise_multiplier,
                        settings.ssa_dp_clip_norm,
                        budget_epsilon=settings.ssa_dp_budget_epsilon,
                    ),
                    **knobs,
                ),
                learns=SECURE_LEARNS if not settings.ssa_weighted else WEIGHTED_LEARNS,
                equivalent_to="plaintext" if compare else None,
                description=description,
            )
        ]
        if compare:
            arms.append(
                Arm(
                    "plaintext",
                    "plaintext",
                    lambda setup: ObservedFedSubAvg(
                        unit_weights=not settings.ssa_weighted, **knobs
                    ),
                    learns=PLAIN_LEARNS,
                    description=description,
                )
            )
        dense = dense_bytes(model)

        def extras(result: ExperimentResult) -> dict[str, Any]:
            plain = result.record.arm("plaintext") if compare else None
            return {
                "bytes": bytes_table(result.record.arm("secure"), plain, dense),
                "dense_bytes": {"down": dense[0], "up": dense[1]},
                "s0_view": s0_view(result, shape, model[TABLE]),
                "privacy": privacy_line(result),
            }

        experiment = Experiment(
            name="dpf-psr-newsgroups",
            arms=arms,
            initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
            num_rounds=settings.num_server_rounds,
            sampling_seed=settings.seed,
            run_config=run_config,
            metrics=[ACCURACY, LOSS],
            evaluate_fn=global_evaluate,
            baseline="plaintext" if compare else "secure",
            results_dir=settings.results_dir or None,
            extras=extras,
        )
        return experiment.run(grid)
