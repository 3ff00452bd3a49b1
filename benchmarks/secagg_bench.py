"""SecAggFedAvg vs Flower's legacy SecAgg+ on the same clients, vectors and settings, in one run.

Run ``python benchmarks/secagg_bench.py [--lengths 10000 100000 1000000] [--clients 10 20 50]
[--dropout 0.0] [--seed 0] [--json PATH]``. For every vector length ``L`` and client count
``n`` it runs one federated round twice, on the same :class:`flwr_fsl.testing.InProcessGrid`
machinery (no Ray: both server sides only need a ``Grid``):

* **ours**: :class:`flwr_fsl.strategies.SecAggFedAvg` (``start``, one round) with
  ``ClientApp(mods=[secagg_mod])`` and a Message-API ``@app.train``;
* **legacy**: the installed Flower's (its version is printed)
  ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` on a ``LegacyContext`` (legacy
  ``FedAvg``, one round) with ``ClientApp(client_fn=..., mods=[secaggplus_mod])`` and a
  ``NumPyClient`` — the only way Flower runs SecAgg+ today.

Both get the same fixed model update: client ``i`` returns the float32 vector ``x_i`` (uniform
in ``[-1, 1]``, length ``L``) with weight ``num-examples = c_i`` (integers in ``[100, 1000]``),
the global model is zero, so both aggregates should be the weighted mean
``sum c_i x_i / sum c_i``. Shared settings: reconstruction threshold 0.6 (ours: ``ceil(0.6 n)``
of the sampled clients; legacy: ``round(0.6 * num_shares)``, equal for the default ``n``),
clipping range 8, ``max_weight = 1000``; legacy SecAgg+ with ``num_shares = 1.0`` (every client
is every client's neighbour: Bonawitz's complete graph, as ours). ``--dropout`` of the clients
(the same partitions in both) lose their masked-input reply after sharing, so both servers
must reconstruct their keys and remove their pair masks.

Reported per arm: **client seconds** (mean per client over the round's four phases, timed by
an outermost client mod around everything the ClientApp does), **server seconds** (the round's
wall time minus the time inside the grid's push/pull, i.e. what the ServerApp itself spends),
**bytes up/down per client** (protobuf size of each message's ``RecordDict``, Flower's own
encoding, as :mod:`flwr_fsl.core.traffic` counts them; the grid's copying is neither party's time),
and the **largest error** against the plaintext weighted mean beside its bound: ours
``n 2^-24 / sum c + 2^-23`` (fixed point with 24 fractional bits, float32 result), legacy
``n Δ / sum d + max|x| sum_i |d_i / sum d - c_i / sum c|`` with ``Δ = 2 clip / 2^22`` (its
stochastic quantization) and ``d_i = round(c_i / max_weight 2^22) / 2^22`` (its quantized
weights). The run fails (exit 1) if either aggregate is outside its bound. The ratio lines are
ours / legacy from the same run.

It also checks Flower's mask PRG (ANCHORS.md): ``secaggplus_utils.pseudo_rand_gen`` is
``np.random.RandomState`` seeded with the shared key XOR-folded to 32 bits (so at most 2^32
distinct masks), drawing ``randint(0, 2^32 - 1)`` (the top value never occurs); the script
reproduces its output from the folded seed and times it per element (median of 5) against our
AES-128-CTR (:func:`flwr_fsl.crypto.prg.ctr_stream`, one 64-bit word per element).

**Issue 26 targets** (``--target``): the cell ``L = 1M, n = 20`` as above, then the lines
``server ours/legacy: X.XX CPU seconds (target <= 0.15) PASS|FAIL`` and ``client ...
(target <= 0.5)``, each with the wall-clock ratio beside it, and the load average. The
verdict uses CPU time (``time.process_time``: every thread of this one process, where the
whole round runs), which other processes' load does not inflate, as it does wall time.

**Scale** (``--scale N [N ...]``, default off; issue 26 asks 1000): one SecAgg+ round of
``N`` clients at ``--scale-length`` words (default 100k) with ``neighbours = 2 ceil(log2 N)``
(:func:`flwr_fsl.families.secagg.graph.suggested_neighbours`), ``--scale-dropout`` of them
lost after sharing, driven in-process through the real
:class:`~flwr_fsl.families.secagg.protocol.SecAggClient` /
:class:`~flwr_fsl.families.secagg.protocol.SecAggServer` (no Flower messages; each masked
input is added to the running sum and discarded, as the strategy streams them). It prints the
round's wall time, client seconds (total and per client), server seconds, peak traced memory
(``tracemalloc``, everything: the N clients' states and the server) and the process's peak RSS,
and checks the sum. ``--scale-budget S`` stops growing ``N`` once a round took more than ``S``
seconds and prints an extrapolation, labelled as such, to the largest ``N`` asked for.
``--profile`` prints the top of a cProfile of the largest scale round.

Writes JSON (default ``benchmarks/results/secagg_bench.json``, git-ignored).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import resource
import sys
import time
import tracemalloc
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.core.traffic import content_bytes
from flwr_fsl.crypto.prg import ctr_stream
from flwr_fsl.families.secagg.graph import round_threshold, suggested_neighbours
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggParams, SecAggServer
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.mods import secagg_mod
from flwr_fsl.strategies import SecAggFedAvg
from flwr_fsl.testing import InProcessGrid

MIB = 1 << 20
CLIP = 8.0
MAX_WEIGHT = 1000.0
THRESHOLD = 0.6
FRAC_BITS = 24  # SecAggFedAvg's default
LEGACY_Q = 1 << 22  # SecAgg+'s default quantization_range
LEGACY_MOD = 1 << 32  # SecAgg+'s default modulus_range


@dataclass
class Setting:
    """One cell: ``n`` clients, their vectors ``xs`` and weights, who drops after sharing."""

    n: int
    length: int
    xs: list[NDArray[np.float32]]
    weights: NDArray[np.int64]
    dropped: frozenset[int]  # partition ids

    @property
    def survivors(self) -> list[int]:
        """Partition ids whose masked input reaches the server."""
        return [i for i in range(self.n) if i not in self.dropped]

    def plaintext_mean(self, weights: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
        """Return the weighted mean over the survivors (``weights`` default: ``c_i``)."""
        w = self.weights.astype(np.float64) if weights is None else weights
        keep = self.survivors
        total = np.zeros(self.length, dtype=np.float64)
        for i in keep:
            total += w[i] * self.xs[i].astype(np.float64)
        return total / float(sum(w[i] for i in keep))


class Clock:
    """An outermost client mod that adds up the seconds each node's ClientApp runs."""

    def __init__(self) -> None:
        self.seconds: defaultdict[int, float] = defaultdict(float)
        self.cpu: defaultdict[int, float] = defaultdict(float)

    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Time ``call_next`` (the other mods and the app) for ``context.node_id``."""
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return call_next(msg, context)
        finally:
            self.seconds[context.node_id] += time.perf_counter() - start
            self.cpu[context.node_id] += time.process_time() - cpu


class MeteredGrid(InProcessGrid):
    """:class:`InProcessGrid` that counts bytes per node each way and its own time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.down: Counter[int] = Counter()
        self.up: Counter[int] = Counter()
        self.grid_s = 0.0
        self.grid_cpu = 0.0
        self.cpu0 = self.cpu1 = 0.0  # the thread's CPU clock around the round

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Count each message's content, deliver it (the ClientApp runs here)."""
        start, cpu = time.perf_counter(), time.process_time()
        sent = list(messages)
        for msg in sent:
            self.down[msg.metadata.dst_node_id] += content_bytes(msg.content)
        ids = list(super().push_messages(sent))
        self.grid_s += time.perf_counter() - start
        self.grid_cpu += time.process_time() - cpu
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return the replies, counting each one's content."""
        start, cpu = time.perf_counter(), time.process_time()
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if reply.has_content():
                self.up[reply.metadata.src_node_id] += content_bytes(reply.content)
        self.grid_s += time.perf_counter() - start
        self.grid_cpu += time.process_time() - cpu
        return replies


def make_setting(n: int, length: int, dropout: float, seed: int) -> Setting:
    """Draw the clients' vectors and weights and the partitions lost after sharing."""
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1.0, 1.0, length).astype(np.float32) for _ in range(n)]
    weights = rng.integers(100, int(MAX_WEIGHT) + 1, n)
    dropped = frozenset(int(i) for i in rng.choice(n, size=int(dropout * n), replace=False))
    return Setting(n, length, xs, weights, dropped)


def _partition(context: Context) -> int:
    return int(context.node_config["partition-id"])


def _lost(setting: Setting, is_masked_phase: Callable[[Message], bool]) -> Callable[..., bool]:
    def lost(node: int, msg: Message) -> bool:
        return node - 1000 in setting.dropped and is_masked_phase(msg)

    return lost


def run_ours(setting: Setting) -> tuple[NDArray[np.float64], MeteredGrid, Clock, float]:
    """One SecAggFedAvg round; return the aggregate, the grid, the clock and the wall time."""
    clock = Clock()
    app = ClientApp(mods=[clock.mod, secagg_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = _partition(context)
        content = RecordDict(
            {
                "arrays": ArrayRecord({"x": Array(setting.xs[i])}),
                "metrics": MetricRecord({"num-examples": int(setting.weights[i])}),
            }
        )
        return Message(content=content, reply_to=msg)

    def masked_phase(msg: Message) -> bool:
        record = msg.content.config_records.get(SECAGG_KEY)
        return record is not None and record.get("phase") == "train"

    grid = MeteredGrid(app, setting.n, drop_nodes=_lost(setting, masked_phase))
    strategy = SecAggFedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=setting.n,
        min_available_nodes=setting.n,
        reconstruction_threshold=THRESHOLD,
        clipping_range=CLIP,
        max_weight=MAX_WEIGHT,
        train_metrics=(),
        frac_bits=FRAC_BITS,
        weighted=True,  # the legacy workflow weights by num-examples: the same settings
    )
    initial = ArrayRecord({"x": Array(np.zeros(setting.length, dtype=np.float32))})
    start, grid.cpu0 = time.perf_counter(), time.process_time()
    result = strategy.start(grid, initial, num_rounds=1)
    wall = time.perf_counter() - start
    grid.cpu1 = time.process_time()
    if strategy.failed_rounds:
        raise RuntimeError(f"SecAggFedAvg round failed: {strategy.failed_rounds}")
    return result.arrays["x"].numpy().astype(np.float64), grid, clock, wall


def run_legacy(setting: Setting) -> tuple[NDArray[np.float64], MeteredGrid, Clock, float]:
    """One round of Flower's legacy SecAgg+ workflow; same return values as :func:`run_ours`."""
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
        Stage,
    )
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg as LegacyFedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_PARAMS_RECORD

    clock = Clock()
    zero = np.zeros(setting.length, dtype=np.float32)

    class FixedClient(NumPyClient):
        def __init__(self, i: int) -> None:
            self.i = i

        def get_parameters(self, config: dict[str, Any]) -> list[NDArray[np.float32]]:
            return [zero]

        def fit(
            self, parameters: list[NDArray[Any]], config: dict[str, Any]
        ) -> tuple[list[NDArray[np.float32]], int, dict[str, Any]]:
            return [setting.xs[self.i]], int(setting.weights[self.i]), {}

    def client_fn(context: Context) -> Any:
        return FixedClient(_partition(context)).to_client()

    app = ClientApp(client_fn=client_fn, mods=[clock.mod, secaggplus_mod])

    def masked_phase(msg: Message) -> bool:
        record = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        return record is not None and record.get(Key.STAGE) == Stage.COLLECT_MASKED_VECTORS

    grid = MeteredGrid(app, setting.n, drop_nodes=_lost(setting, masked_phase))
    strategy = LegacyFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=setting.n,
        min_available_clients=setting.n,
        initial_parameters=ndarrays_to_parameters([zero]),
    )
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = LegacyContext(base, config=ServerConfig(num_rounds=1), strategy=strategy)
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(
            num_shares=1.0,
            reconstruction_threshold=THRESHOLD,
            max_weight=MAX_WEIGHT,
            clipping_range=CLIP,
            quantization_range=LEGACY_Q,
            modulus_range=LEGACY_MOD,
        )
    )
    start, grid.cpu0 = time.perf_counter(), time.process_time()
    workflow(grid, context)
    wall = time.perf_counter() - start
    grid.cpu1 = time.process_time()
    # A halted SecAgg+ round leaves the zero model: the error check in measure() catches it.
    record = context.state.array_records[MAIN_PARAMS_RECORD]
    (out,) = parameters_to_ndarrays(compat.arrayrecord_to_parameters(record, keep_input=True))
    return np.asarray(out, dtype=np.float64), grid, clock, wall


def bounds(setting: Setting) -> tuple[float, float, NDArray[np.float64]]:
    """Return (ours' bound, legacy's bound, legacy's quantized weights ``d_i``)."""
    keep = setting.survivors
    c = setting.weights.astype(np.float64)
    m = len(keep)
    ours = m * 2.0**-FRAC_BITS / float(c[keep].sum()) + 2.0**-23
    d = np.round(c / MAX_WEIGHT * LEGACY_Q) / LEGACY_Q
    step = 2 * CLIP / LEGACY_Q
    max_x = max(float(np.max(np.abs(setting.xs[i]))) for i in keep)
    weight_term = float(np.sum(np.abs(d[keep] / d[keep].sum() - c[keep] / c[keep].sum())))
    legacy = m * step / float(d[keep].sum()) + max_x * weight_term + 1e-12
    return ours, legacy, d


def measure(setting: Setting) -> list[dict[str, Any]]:
    """Run both arms on ``setting``; return one row per arm."""
    expected = setting.plaintext_mean()
    ours_bound, legacy_bound, _ = bounds(setting)
    rows = []
    for arm, runner, bound in (
        ("ours", run_ours, ours_bound),
        ("legacy", run_legacy, legacy_bound),
    ):
        aggregate, grid, clock, wall = runner(setting)
        error = float(np.max(np.abs(aggregate - expected)))
        client_total = sum(clock.seconds.values())
        rows.append(
            {
                "arm": arm,
                "clients": setting.n,
                "length": setting.length,
                "dropped": len(setting.dropped),
                "client_s": client_total / setting.n,
                "server_s": wall - grid.grid_s,
                # CPU seconds of this process (all threads): robust to other processes' load.
                "client_cpu_s": sum(clock.cpu.values()) / setting.n,
                "server_cpu_s": grid.cpu1 - grid.cpu0 - grid.grid_cpu,
                "grid_s": grid.grid_s - client_total,
                "wall_s": wall,
                "up_mib_per_client": sum(grid.up.values()) / setting.n / MIB,
                "down_mib_per_client": sum(grid.down.values()) / setting.n / MIB,
                "max_abs_error": error,
                "error_bound": bound,
                "within_bound": error <= bound,
            }
        )
    return rows


def scale_round(n: int, length: int, dropout: float, seed: int) -> dict[str, Any]:
    """One SecAgg+ round of ``n`` clients (``neighbours = 2 ceil(log2 n)``), streamed; check it."""
    k = suggested_neighbours(n)
    t, sparse = round_threshold(THRESHOLD, n, k)
    params = SecAggParams(1, os.urandom(16), t, length, sparse)
    rng = np.random.default_rng(seed)
    ids = [1000 + i for i in range(n)]
    lost = {int(u) for u in rng.choice(ids, size=int(dropout * n), replace=False)}
    base = np.arange(length, dtype=np.uint64)
    clock = {"client": 0.0, "server": 0.0, "client-cpu": 0.0, "server-cpu": 0.0}

    def timed(side: str, fn: Callable[[], Any]) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        out = fn()
        clock[side] += time.perf_counter() - start
        clock[f"{side}-cpu"] += time.process_time() - cpu
        return out

    tracemalloc.start()
    wall = time.perf_counter()
    server = timed("server", lambda: SecAggServer(params))
    clients = {u: timed("client", lambda u=u: SecAggClient(u, params)) for u in ids}
    for u, c in clients.items():
        ad = timed("client", c.advertise)
        timed("server", lambda u=u, ad=ad: server.add_advertisement(u, ad))
    roster = timed("server", server.roster)
    for u, c in clients.items():
        bundle = timed("client", lambda c=c: c.share_keys(roster))
        timed("server", lambda u=u, b=bundle: server.add_shares(u, b))
    u2 = timed("server", server.sharers)
    for u, c in clients.items():
        if u in lost:
            continue
        x = base * np.uint64(u)  # x_u = u * (0, 1, 2, ...): the sum is known in closed form
        y = timed("client", lambda c=c, x=x: c.masked_input(u2, x))
        timed("server", lambda u=u, y=y: server.add_masked_input(u, y))
        del x, y
    for u in server.survivors:
        request = timed("server", lambda u=u: server.unmask_request(u))
        reply = timed("client", lambda u=u, r=request: clients[u].unmask(r))
        timed("server", lambda u=u, r=reply: server.add_unmask(u, r))
    total = timed("server", server.result)
    wall = time.perf_counter() - wall
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    expected = base * np.uint64(sum(u for u in ids if u not in lost))
    return {
        "clients": n, "length": length, "neighbours": k, "threshold": t, "lost": len(lost),
        "wall_s": wall, "client_s": clock["client"], "client_s_per_client": clock["client"] / n,
        "server_s": clock["server"], "peak_traced_mib": peak / MIB,
        "client_cpu_s": clock["client-cpu"], "server_cpu_s": clock["server-cpu"],
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "correct": bool(np.array_equal(total, expected)),
    }  # fmt: skip


def run_scale(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Grow ``n`` through ``--scale`` (stop past ``--scale-budget`` s); print, extrapolate."""
    print(
        f"SecAgg+ scale: one round, L = {args.scale_length:,}, neighbours = 2 ceil(log2 n), "
        f"t = {THRESHOLD} of neighbours + 1, {args.scale_dropout:.0%} lost after sharing "
        f"(in-process protocol, streamed sum); load average {_load()}"
    )
    print(
        f"{'n':>6} {'k':>4} {'t':>4} {'wall s':>8} {'client s':>9} {'per client':>11} "
        f"{'server s':>9} {'peak MiB':>9} {'maxRSS MiB':>11} {'sum ok':>6}  (CPU s: client, server)"
    )
    rows: list[dict[str, Any]] = []
    for n in sorted(args.scale):
        if rows and rows[-1]["wall_s"] > args.scale_budget:
            break
        profiler = cProfile.Profile() if args.profile and n == max(args.scale) else None
        if profiler is not None:
            profiler.enable()
        row = scale_round(n, args.scale_length, args.scale_dropout, args.seed + n)
        if profiler is not None:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
            row["profile"] = text.getvalue()
        rows.append(row)
        print(
            f"{n:>6} {row['neighbours']:>4} {row['threshold']:>4} {row['wall_s']:>8.2f} "
            f"{row['client_s']:>9.2f} {row['client_s_per_client'] * 1e3:>9.1f}ms "
            f"{row['server_s']:>9.2f} {row['peak_traced_mib']:>9.1f} {row['max_rss_mib']:>11.1f} "
            f"{'yes' if row['correct'] else 'NO':>6}  "
            f"({row['client_cpu_s']:.2f}, {row['server_cpu_s']:.2f})"
        )
    if rows and "profile" in rows[-1]:
        print(rows[-1]["profile"])
    largest, wanted = rows[-1], max(args.scale)
    if largest["clients"] < wanted:
        # Per-client work grows with k (log n); the server's unmasking with n k: scale linearly
        # in n times k / k_largest (an estimate, not a measurement).
        factor = wanted / largest["clients"] * suggested_neighbours(wanted) / largest["neighbours"]
        print(
            f"EXTRAPOLATED (not run; budget {args.scale_budget:g} s): n = {wanted} would take "
            f"about {largest['wall_s'] * factor:.0f} s wall and "
            f"{largest['peak_traced_mib'] * wanted / largest['clients']:.0f} MiB traced, "
            f"from n = {largest['clients']} scaled by n k"
        )
    return rows


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _median_seconds(fn: Callable[[], object], reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2]


def legacy_prg(length: int, seed: int) -> dict[str, Any]:
    """Check that Flower's mask PRG is RandomState on a 32-bit fold; time it against AES-CTR."""
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    key = np.random.default_rng(seed).bytes(32)
    folded = 0
    for i in range(0, len(key), 4):
        folded ^= int.from_bytes(key[i : i + 4], "little")
    (mask,) = pseudo_rand_gen(key, LEGACY_MOD, [(length,)])
    # The folded seed alone reproduces the mask: 2^32 seeds cover every mask there is.
    again = np.random.RandomState(folded).randint(0, LEGACY_MOD - 1, length, dtype=np.int64)
    legacy_s = _median_seconds(lambda: pseudo_rand_gen(key, LEGACY_MOD, [(length,)]))
    ours_s = _median_seconds(lambda: ctr_stream(key[:16], bytes(16), length))
    return {
        "elements": length,
        "randomstate_from_32bit_fold": bool(np.array_equal(mask, again)),
        "legacy_ns_per_element": legacy_s / length * 1e9,
        "aes_ctr_ns_per_word": ours_s / length * 1e9,
    }


def main() -> None:
    """Print the table and the ratios, write JSON; exit 1 if an aggregate is off."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 20, 50])
    parser.add_argument("--dropout", type=float, default=0.0, help="lost after sharing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prg-elements", type=int, default=1_000_000)
    parser.add_argument("--json", default="benchmarks/results/secagg_bench.json")
    parser.add_argument(
        "--target", action="store_true", help="issue 26: L = 1M, n = 20 and the PASS/FAIL lines"
    )
    parser.add_argument("--scale", type=int, nargs="*", default=[], help="e.g. 100 300 1000")
    parser.add_argument("--scale-length", type=int, default=100_000)
    parser.add_argument("--scale-dropout", type=float, default=0.05)
    parser.add_argument("--scale-budget", type=float, default=240.0, help="seconds per round")
    parser.add_argument("--profile", action="store_true", help="cProfile the largest scale round")
    parser.add_argument("--no-compare", action="store_true", help="only --scale")
    args = parser.parse_args()
    if args.target:
        args.lengths, args.clients = [1_000_000], [20]
    if not 0.0 <= args.dropout < 1.0 - THRESHOLD:
        parser.error(f"--dropout must be in [0, {1 - THRESHOLD:.1f}) so t clients remain")
    if any(n < 3 for n in args.clients) or any(m < 1 for m in args.lengths):
        parser.error("--clients must be >= 3 and --lengths >= 1")
    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.getLogger("flwr_fsl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    print(
        f"SecAggFedAvg (ours) vs Flower {_flwr_version()} SecAgg+ workflow (legacy), one round, "
        f"in-process grid; t = {THRESHOLD}, clip {CLIP:g}, max_weight {MAX_WEIGHT:g}, "
        f"legacy num_shares = all, {args.dropout:.0%} lost after sharing"
    )
    header = (
        f"{'L':>9} {'n':>4} {'arm':<7} {'client s':>9} {'server s':>9} {'up MiB/cl':>10} "
        f"{'down MiB/cl':>12} {'max |err|':>10} {'bound':>9} {'ok':>3}"
    )
    print(header)
    print("-" * len(header))
    measure(make_setting(3, 100, 0.0, args.seed))  # warm-up: imports, first calls
    rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    for length in [] if args.no_compare else args.lengths:
        for n in args.clients:
            setting = make_setting(n, length, args.dropout, args.seed + 1000 * n + length)
            pair = measure(setting)
            rows.extend(pair)
            for row in pair:
                print(
                    f"{length:>9} {n:>4} {row['arm']:<7} {row['client_s']:>9.3f} "
                    f"{row['server_s']:>9.3f} {row['up_mib_per_client']:>10.3f} "
                    f"{row['down_mib_per_client']:>12.3f} {row['max_abs_error']:>10.2e} "
                    f"{row['error_bound']:>9.1e} {'yes' if row['within_bound'] else 'NO':>3}"
                )
            ours, legacy = pair
            ratio = {
                "length": length,
                "clients": n,
                **{
                    k: ours[k] / legacy[k]
                    for k in (
                        "client_s",
                        "server_s",
                        "client_cpu_s",
                        "server_cpu_s",
                        "up_mib_per_client",
                        "down_mib_per_client",
                    )
                },
            }
            ratios.append(ratio)
            print(
                f"{length:>9} {n:>4} {'ratio':<7} {ratio['client_s']:>9.2f} "
                f"{ratio['server_s']:>9.2f} {ratio['up_mib_per_client']:>10.2f} "
                f"{ratio['down_mib_per_client']:>12.2f}   (ours / legacy)"
            )
            del setting
    if args.target and ratios:
        cell = ratios[-1]
        for side, goal in (("server", 0.15), ("client", 0.5)):
            value = cell[f"{side}_cpu_s"]
            verdict = "PASS" if value <= goal else "FAIL"
            print(
                f"{side} ours/legacy: {value:.2f} CPU seconds (target <= {goal}) {verdict}; "
                f"wall clock {cell[f'{side}_s']:.2f}"
            )
        print(f"load average during the run: {_load()} (2 shared cores: timings are noisy)")
    scale = run_scale(args) if args.scale else []
    prg = legacy_prg(args.prg_elements, args.seed)
    print(
        f"legacy mask PRG: np.random.RandomState seeded with the key XOR-folded to 32 bits "
        f"(reproduced from the fold: {prg['randomstate_from_32bit_fold']}), "
        f"{prg['legacy_ns_per_element']:.1f} ns/element; ours AES-128-CTR "
        f"{prg['aes_ctr_ns_per_word']:.1f} ns per 64-bit word ({prg['elements']:,} elements)"
    )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    for row in scale:
        row.pop("profile", None)
    path.write_text(
        json.dumps({"args": vars(args), "rows": rows, "ratios": ratios, "prg": prg, "scale": scale})
    )
    print(f"wrote {path}")
    if not all(r["correct"] for r in scale):
        print("a scale round's sum is wrong", file=sys.stderr)
        sys.exit(1)
    if not all(r["within_bound"] for r in rows):
        print("an aggregate is outside its quantization bound", file=sys.stderr)
        sys.exit(1)


def _flwr_version() -> str:
    import flwr

    return str(getattr(flwr, "__version__", "?"))


if __name__ == "__main__":
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    main()
