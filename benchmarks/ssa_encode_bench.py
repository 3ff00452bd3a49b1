"""SSA client encode against its AES floor, this tree beside an older commit, in one run.

Run ``python benchmarks/ssa_encode_bench.py [--base REV] [--log-m 20] [--rate 0.10]
[--value-check projected|off] [--projected-digest 0|1|2] [--cores 2] [--phases] [--timeline]``.
It times
:func:`~flwr_fsl.families.ssa.protocol.encode_update` (the checked round, the default: unit
weights, verifiable keys and the projected value check's trailer, or ``--value-check off``; the
round's simple table built beforehand, as a client has it; ``--projected-digest 2``: the
projected check's digest version 2, parameter version 8, ``1`` version 1, pinned in both
trees; the default ``0``: each tree's default round; a ``--base`` tree without the field runs
its default round, version 1) in a child process pinned to one
core: wall and CPU time, best of ``--reps`` after one untimed call, and the AES-only time of
the same encode (its DPF AES calls recorded in place and replayed alone,
:func:`ssa_bench.aes_floor`); then, where the machine has them, the wall time in a child
pinned to ``--cores`` cores (key generation uses every core it may run on by default). With
``--base REV`` the package of commit ``REV`` (``git archive``, unpacked once into the
temporary directory and reused) runs the same inputs in the same way, the two trees
alternating ``--rounds`` times so that load on a shared machine falls on both; each tree's
best figures are printed with their ratios, the load average before and after, and the issue
26 line ``client encode: X ms wall (C ms CPU) on 1 core, Y ms wall on 2 cores (AES-only Z ms;
value check ...; target <= 40 ms: 1 core PASS/FAIL, 2 cores PASS/FAIL)`` for this tree.
``--phases`` adds a table of the 1-core encode's phases (:data:`PHASES`: the calling thread's
CPU time of each, its best over ``--reps`` more encodes, nested phases indented under the one
that calls them; then the wrapped encode's own CPU time and the part of it outside the
top-level phases, :data:`ENCODE` and :data:`OUTSIDE`), each tree's side by side; a tree
without a phase's function shows ``-``.
``--timeline`` prints, for this tree's fastest ``--cores``-core encode, every thread's busy
intervals (:data:`PHASES` and the pool threads' work, :data:`TIMELINE_EXTRA`: wall ms from the
encode's start) and how much of the wall had one thread busy, and how much two or more.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 40.0  # issue 26's client encode target

PHASES = (
    ("payload", "flwr_fsl.families.ssa.protocol", "payload_words"),
    ("placement", "flwr_fsl.families.ssa.protocol", "place_indices"),
    ("  sort", "flwr_fsl.families.ssa.placement", "_sorted_rows"),
    ("  candidate bins", "flwr_fsl.families.ssa.placement", "_candidate_bins"),
    ("  cuckoo insert", "flwr_fsl.families.ssa.placement", "cuckoo_insert"),
    ("  place_in_bins", "flwr_fsl.families.ssa.placement", "place_in_bins"),
    ("betas", "flwr_fsl.families.ssa.upload", "key_betas"),
    ("keys and trailer", "flwr_fsl.families.ssa.upload", "generate_keys_batch"),
    ("  root seeds", "flwr_fsl.crypto.dpf", "gen_roots"),
    ("  Gen plan", "flwr_fsl.kernels.dpf_gen_kernels", "gen_plan"),
    ("  Gen kernel", "flwr_fsl.kernels.dpf_gen_kernels", "gen_run"),
    ("  trailer", "flwr_fsl.families.ssa.protocol", "value_trailer"),
    ("    digest and parts", "flwr_fsl.families.ssa.projected_check", "_bindings"),
    ("    projections", "flwr_fsl.families.ssa.projected_check", "project_shares"),
    ("    range upload", "flwr_fsl.families.ssa.range_check", "make_upload"),
)
"""``(label, module, name)`` of each phase ``--phases`` times: the name as the caller looks it
up (a kernel through its module attribute, so the wrapper sees the calls from Python)."""

ENCODE = "whole encode"
OUTSIDE = "  outside the phases"
"""Rows the phase table adds: the wrapped encode's thread CPU, and what of it no top-level
phase covers (each the best over the same encodes as the phases)."""

TIMELINE_EXTRA = (
    ("Gen range", "flwr_fsl.kernels.dpf_gen_kernels", "gen_run"),
    ("party keys", "flwr_fsl.families.ssa.projected_check", "_parts"),
    ("projection range", "flwr_fsl.families.ssa.projected_check", "project_range"),
)
"""What ``--timeline`` wraps besides :data:`PHASES`: the work the pools' threads run (and each
digest piece's SHA-256, through the projected check's ``hashlib``)."""


def _timeline(encode: Callable[[], object], reps: int) -> list[tuple[str, str, float, float]]:
    """``(thread, label, start ms, end ms)`` of every wrapped call of the fastest of ``reps``."""
    import hashlib
    import importlib
    import threading

    events: list[tuple[str, str, float, float]] = []
    for label, module, name in (*PHASES, *TIMELINE_EXTRA):
        mod = importlib.import_module(module)
        fn = getattr(mod, name, None)
        if fn is None:  # an older tree
            continue

        def timed(*a: Any, _fn: Any = fn, _label: str = label.strip(), **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                end = time.perf_counter()
                events.append((threading.current_thread().name, _label, start, end))

        setattr(mod, name, timed)

    class _Hashlib:  # the digest's pieces: a SHA-256 of at least 64 KiB
        def __getattr__(self, name: str) -> Any:
            return getattr(hashlib, name)

        def sha256(self, data: Any = b"") -> Any:
            start = time.perf_counter()
            h = hashlib.sha256(data)
            if len(memoryview(data)) >= 1 << 16:
                name = threading.current_thread().name
                events.append((name, "digest piece", start, time.perf_counter()))
            return h

    pc = importlib.import_module("flwr_fsl.families.ssa.projected_check")
    pc.hashlib = _Hashlib()  # type: ignore[assignment]
    best: tuple[float, list[tuple[str, str, float, float]]] = (float("inf"), [])
    for _ in range(reps):
        events.clear()
        t0 = time.perf_counter()
        encode()
        wall = time.perf_counter() - t0
        if wall < best[0]:
            rows = [(th, lb, 1e3 * (s - t0), 1e3 * (e - t0)) for th, lb, s, e in events]
            best = (wall, sorted(rows, key=lambda r: (r[0], r[2])))
    return best[1]


def _phase_times(encode: Callable[[], object], reps: int) -> dict[str, float]:
    """Best thread CPU ms of each :data:`PHASES` entry over ``reps`` encodes (wrapped in place)."""
    import importlib

    spent: dict[str, float] = {}
    for label, module, name in PHASES:
        mod = importlib.import_module(module)
        fn = getattr(mod, name, None)
        if fn is None:  # an older tree
            continue

        def timed(*a: Any, _fn: Any = fn, _label: str = label, **kw: Any) -> Any:
            start = time.thread_time()
            try:
                return _fn(*a, **kw)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.thread_time() - start

        setattr(mod, name, timed)
    best: dict[str, float] = {}
    top = [label for label, _, _ in PHASES if not label.startswith(" ")]
    for _ in range(reps):
        spent.clear()
        start = time.thread_time()
        encode()
        spent[ENCODE] = time.thread_time() - start
        spent[OUTSIDE] = spent[ENCODE] - sum(spent.get(label, 0.0) for label in top)
        for label, s in spent.items():
            best[label] = min(best.get(label, float("inf")), 1e3 * s)
    return best


def _worker(
    log_m: int,
    rate: float,
    reps: int,
    value_check: str,
    cores: int,
    digest: int,
    extras: tuple[bool, bool],
) -> dict[str, Any]:
    """Time one tree's encode in this (child) process, pinned to ``cores`` cores.

    On one core it also measures the AES floor; on more, only the wall time (the tree's
    default thread count follows the cores it may use). ``extras`` is ``(phases, timeline)``:
    the 1-core phase table's times, the multi-core run's timeline.
    """
    phases, timeline = extras
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cores]))
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ssa_bench import aes_floor, client_inputs, make_params

    from flwr_fsl.families.ssa import protocol as ssa

    m = 1 << log_m
    k = max(1, round(rate * m))
    params = replace(make_params(m, k, weighted=False, verify=True), value_check=value_check)
    if digest and "projected_digest" in params.__dataclass_fields__:
        params = replace(params, projected_digest=digest)  # (an older tree: its default round)
    table = ssa.simple_table_for(params)
    idx, vals, _ = client_inputs(m, k, np.random.default_rng(7))
    seeds = (bytes(range(16)), bytes(range(16, 32)))

    def encode() -> object:
        rng = np.random.default_rng(11)
        return ssa.encode_update(params, idx, vals, rng=rng, simple_table=table, master_seeds=seeds)

    encode()  # untimed: numba dispatch, the round's cached domain bits, allocator pages
    wall, cpu = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        encode()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    if cores > 1:
        row: dict[str, Any] = {"encode_ms": 1e3 * min(wall), "cpu_ms": 1e3 * min(cpu)}
        if timeline:
            row["timeline"] = _timeline(encode, reps)
        return row
    floor = aes_floor(encode)
    row = {
        "encode_ms": 1e3 * min(wall),
        "cpu_ms": 1e3 * min(cpu),
        "aes_ms": 1e3 * floor["replay_s"],
        "aes_blocks": floor["blocks"],
        "aes_calls": floor["calls"],
    }
    if phases:  # last: the wrappers stay in place
        row |= {f"phase:{k}": v for k, v in _phase_times(encode, reps).items()}
    return row


def _base_tree(rev: str) -> Path:
    """Unpack ``flwr_fsl`` of commit ``rev`` once (reused: its numba cache survives runs)."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"flwr_fsl-base-{sha[:12]}"
    if not (dest / "flwr_fsl").is_dir():
        blob = subprocess.run(
            ["git", "-C", str(ROOT), "archive", sha, "flwr_fsl"], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def _run(
    tree: Path, args: argparse.Namespace, cores: int, timeline: bool = False
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", f"--log-m={args.log_m}", f"--rate={args.rate}"]
    cmd += [f"--value-check={args.value_check}", f"--cores={cores}"]
    cmd += [f"--projected-digest={args.projected_digest or 0}"]
    cmd += ["--phases"] if args.phases and cores == 1 else []
    cmd += ["--timeline"] if timeline and cores > 1 else []
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [*cmd, f"--reps={args.reps}"], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # pragma: no cover - not Linux
        return "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="an older commit to time beside this tree")
    parser.add_argument("--log-m", type=int, default=20, help="log2 m (20)")
    parser.add_argument("--rate", type=float, default=0.10, help="k/m (0.10)")
    parser.add_argument("--reps", type=int, default=5, help="timed encodes per child (5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the trees (3)")
    parser.add_argument(
        "--value-check",
        choices=("projected", "off"),
        default="projected",
        help="the checked round's value check (projected: the default of a checked round)",
    )
    parser.add_argument(
        "--projected-digest",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="the projected check's digest version (0: each tree's default round's)",
    )
    parser.add_argument(
        "--cores", type=int, default=2, help="cores of the multi-core run (2; 1: none)"
    )
    parser.add_argument(
        "--phases", action="store_true", help="also print the 1-core encode's phases (CPU ms)"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="also print this tree's multi-core encode: each thread's busy intervals",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        row = _worker(
            args.log_m,
            args.rate,
            args.reps,
            args.value_check,
            args.cores,
            args.projected_digest,
            (args.phases, args.timeline),
        )
        print(json.dumps(row))
        return
    trees = {"this tree": ROOT}
    if args.base:
        trees[f"base {args.base}"] = _base_tree(args.base)
    multi = args.cores if args.cores > 1 and _usable_cores() >= args.cores else 0
    print(
        f"SSA client encode (checked round, value check {args.value_check}, "
        f"digest {_digest_name(args.projected_digest)}), "
        f"m = 2^{args.log_m}, k/m = {args.rate:.0%}: 1 core"
        + (f", and {multi} cores (Gen threads: all the cores)" if multi else "")
    )
    print(f"load average before: {_loadavg()}")
    best: dict[str, dict[str, float]] = {}
    lines: dict[str, tuple[float, list[Any]]] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            row = _run(tree, args, 1)
            if multi:
                many = _run(tree, args, multi, args.timeline)
                row["multi_ms"] = many["encode_ms"]
                if "timeline" in many and many["encode_ms"] < lines.get(name, (1e9, []))[0]:
                    lines[name] = (many["encode_ms"], many["timeline"])
            keep = best.setdefault(name, row)
            for key in row:
                keep[key] = min(keep.get(key, row[key]), row[key])
    print(f"load average after: {_loadavg()}")
    _table(best, multi)
    if args.phases:
        _phase_table(best)
    for name, (ms, events) in lines.items():
        _print_timeline(name, ms, multi, events)
    new = best["this tree"]
    if args.base:
        old = best[f"base {args.base}"]
        print(
            f"speed-up over {args.base}: {old['encode_ms'] / new['encode_ms']:.2f}x wall, "
            f"{old['cpu_ms'] / new['cpu_ms']:.2f}x CPU (1 core)"
            + (f", {old['multi_ms'] / new['multi_ms']:.2f}x wall ({multi} cores)" if multi else "")
        )
    verdicts = [f"1 core {_verdict(new['encode_ms'])}"]
    line = f"client encode: {new['encode_ms']:.1f} ms wall ({new['cpu_ms']:.1f} ms CPU) on 1 core"
    if multi:
        line += f", {new['multi_ms']:.1f} ms wall on {multi} cores"
        verdicts.append(f"{multi} cores {_verdict(new['multi_ms'])}")
    print(
        f"{line} (AES-only {new['aes_ms']:.1f} ms; value check {args.value_check}"
        f" (digest {_digest_name(args.projected_digest)}); "
        f"target <= {TARGET_MS:.0f} ms: {', '.join(verdicts)})"
    )


def _digest_name(digest: int) -> str:
    return f"v{digest}" if digest else "of each tree's default round"


def _verdict(ms: float) -> str:
    return "PASS" if ms <= TARGET_MS else "FAIL"


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - platforms without affinity


def _table(best: dict[str, dict[str, float]], multi: int) -> None:
    """Print each tree's best figures."""
    extra = f" {multi}-core wall ms |" if multi else ""
    print(f"| tree | 1-core wall ms | CPU ms | AES-only ms (blocks, calls) | wall / AES |{extra}")
    print("|---|---|---|---|---|" + ("---|" if multi else ""))
    for name, r in best.items():
        print(
            f"| {name} | {r['encode_ms']:.1f} | {r['cpu_ms']:.1f} | {r['aes_ms']:.1f} "
            f"({r['aes_blocks'] / 1e6:.2f}M, {r['aes_calls']:.0f}) | "
            f"{r['encode_ms'] / r['aes_ms']:.2f} |" + (f" {r['multi_ms']:.1f} |" if multi else "")
        )


def _print_timeline(name: str, ms: float, cores: int, events: list[Any]) -> None:
    """Print one encode's busy intervals per thread and the wall with 1 and >= 2 threads busy."""
    print(
        f"timeline of {name}'s fastest {cores}-core encode ({ms:.1f} ms; wall ms from its start):"
    )
    busy: dict[str, list[tuple[float, float]]] = {}
    for thread, label, start, end in events:
        print(f"  {thread:>18} {start:7.2f} .. {end:7.2f} {end - start:6.2f}  {label}")
        busy.setdefault(thread, []).append((start, end))
    edges = sorted({t for spans in busy.values() for s, e in spans for t in (s, e)})
    one = two = 0.0
    for a, b in itertools.pairwise(edges):
        mid = (a + b) / 2
        n = sum(any(s <= mid < e for s, e in spans) for spans in busy.values())
        one += (b - a) if n == 1 else 0.0
        two += (b - a) if n >= 2 else 0.0
    print(f"  threads busy: exactly one {one:.1f} ms, two or more {two:.1f} ms, of {ms:.1f} ms")


def _phase_table(best: dict[str, dict[str, float]]) -> None:
    """Print each tree's best CPU ms per phase (1 core), side by side."""
    names = list(best)
    print("| phase (1 core, CPU ms) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label in (*(label for label, _, _ in PHASES), ENCODE, OUTSIDE):
        cells = [best[n].get(f"phase:{label}") for n in names]
        shown = " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
        print(f"| {label} | {shown} |")


if __name__ == "__main__":
    main()
