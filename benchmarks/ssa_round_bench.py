"""SSA servers over a whole round: time per client against the AES floor, on one core and two.

Run ``python benchmarks/ssa_round_bench.py [--clients N] [--rounds R] [--log-m 20] [--rate 0.10]
[--kinds K1,K2] [--baseline-tree PATH]`` (``--rounds``: timed rounds per configuration, the
fastest reported). Round kinds: the unchecked round (Cui's semi-honest protocol); the checked one
with key-check digest version 2 (SHA-256 per segment: the code before issue 26's GMAC digest, kept
for rounds opened without a digest key); ``checked-v3-keys``, the key check with version 3 (GMAC
under the round's digest key, :mod:`flwr_fsl.families.ssa.verify`) but no value check; and
``checked-v3``, **the default checked round**: key check version 3 plus the projected value check
(:mod:`flwr_fsl.families.ssa.projected_check`), also on the Python driver (``checked-v3-py``: the
path before :mod:`flwr_fsl.kernels.vdpf_eval`, and the fallback without native AES). Before
session 29 this benchmark's "checked" rounds had no value check at all (their parameters were made
with ``replace(..., verify=True)``, which keeps ``value_check="off"``): ``checked-v3-keys`` is
what it measured. For each kind it adds ``N`` clients to one
:class:`~flwr_fsl.families.ssa.protocol.SSAServer` per party and reads the share once, as a round
does (:meth:`~flwr_fsl.families.ssa.protocol.SSAServer.share` scatters the clients' summed shares
once), after one untimed round per party, as on a long-running server whose allocator already
holds the round buffers' pages; the parties' timed rounds alternate (S0 first, then S1 first).
Clients come in relay chunks as :class:`~flwr_fsl.families.ssa.two_server.LeadServer` groups
them (``DEFAULT_RELAY_CHUNK_BYTES``: 3 uploads at ``m = 2**20``, ``k/m = 10%``), each chunk added
with :meth:`~flwr_fsl.families.ssa.protocol.SSAServer.add_clients` (pipelined: the next client
decoded while this one is evaluated; since session 30); a library without it (a baseline tree's)
adds them one at a time.
Each configuration runs in a child process pinned to one core, then to two
(``os.sched_setaffinity``), so the server's threads see exactly those cores.

``--baseline-tree PATH`` (a checkout of another revision, e.g. ``git worktree add /tmp/base
main``) runs every configuration a second time with that tree's library (``PYTHONPATH``; this
file's worker), just before this tree's, and prints ``baseline -> this tree`` ratios measured in
the same run: on a shared machine, compare those, not absolute times of different runs.

It prints, per party and configuration, wall milliseconds per client (the round's time divided
by ``N``), the process's CPU milliseconds per client (all threads; on a loaded machine the CPU
time stays near the work done while the wall time does not), the AES-only time of one client's
evaluation (its DPF AES calls recorded in place and replayed alone,
:func:`ssa_bench.aes_floor`), their ratio, and the two-core speed-up, ending with the lines
``server per client / AES floor: X.XX`` and ``2-core speed-up: X.XX`` (the default checked
round, ``checked-v3``, the worse of S0 and S1 for each), PASS/FAIL beside each (issue 26:
<= 3.2 and >= 1.8). Per kind it also prints the CPU each party spends per client outside
the server's thread pool (one thread, every ``run_ranges`` call timed apart: Amdahl's serial
part) and the speed-up bound it leaves on two cores; measured as thread CPU time, it holds
on a loaded machine too. Clients alternate between two encoded updates (the servers' work does
not depend on which). Figures are ratios measured in one run: absolute times drift on shared
machines.

**What the AES floor counts.** Every AES block the server's evaluation of one client runs,
recorded at the cipher objects (:func:`dpf_bench.record_aes`): the tree levels (left and right
keys), the leaf conversion and, in the checked round, the key check's proof hash (4 AES-MMO
blocks per evaluated point, :mod:`flwr_fsl.kernels.vdpf_kernels`), after subtree skipping (a bin
padded to a power of two costs blocks for its real points only). Replayed alone, one thread. The
checked round also hashes every point's 64-byte proof (the key-check digest: SHA-256 in version
2, GMAC in version 3); that is not in the floor: the table's ``hash ms`` column replays the same
bytes through the same hash in the same segments (one thread), and ``/ AES+hash`` divides by
both. The server runs with its default thread count (every core the child may use).

The client line times :func:`~flwr_fsl.families.ssa.protocol.encode_update` (checked round, best
of 3, one core) beside its AES-only time (issue 26: <= 40 ms).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ssa_bench import aes_floor, client_inputs, make_params

from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.dpf import PROOF_WORDS
from flwr_fsl.families.ssa import protocol as ssa
from flwr_fsl.families.ssa.placement import key_lengths
from flwr_fsl.families.ssa.two_server import DEFAULT_RELAY_CHUNK_BYTES
from flwr_fsl.families.ssa.verify import _NONCE, KeyCheck, new_digest_key

ROUNDS = 1
"""Timed rounds per configuration (``--rounds``; the fastest is reported: on a shared machine
the others lost time to other processes)."""
_KINDS = {
    "unchecked": (False, False, "off"),
    "checked-v2": (True, False, "projected"),
    "checked-v3-py": (True, True, "projected"),
    "checked-v3-keys": (True, True, "off"),
    "checked-v3": (True, True, "projected"),
}
"""Round kind -> (verify, digest key, value check). ``-py``: the checked evaluation on the Python
driver (the path before the native checked driver, :mod:`flwr_fsl.kernels.vdpf_eval`; also the
fallback where OpenSSL does not load natively). ``-keys``: the key check alone, without the value
check (``value_check="off"``; what this benchmark measured as "checked" before session 29: its
parameters were built with ``replace(..., verify=True)``, which keeps ``"off"``). ``checked-v3`` is
the default checked round: key check with digest version 3 and the projected value check."""


def _worker(log_m: int, rate: float, clients: int, kind: str, cores: int) -> dict[str, object]:
    """One configuration in this (child) process: both parties' round time per client."""
    verify, keyed, value_check = _KINDS[kind]
    if kind.endswith("-py"):
        dpf._NATIVE_AES = False  # the Python driver (also what FLWR_FSL_NATIVE_AES=0 gives)
    key = new_digest_key() if keyed else None
    avail = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(avail[:cores]))
    m = 1 << log_m
    k = max(1, round(rate * m))
    rng = np.random.default_rng(7)
    params = make_params(m, k, weighted=False, verify=verify)
    if verify and value_check != params.value_check_mode:
        params = replace(params, value_check=value_check)
    table = ssa.simple_table_for(params)
    uploads = []
    for _ in range(2):
        indices, values, _ = client_inputs(m, k, rng)
        uploads.append(ssa.encode_update(params, indices, values, rng=rng, simple_table=table)[0])
    out: dict[str, object] = {"kind": kind, "cores": len(os.sched_getaffinity(0))}

    # Clients per relayed chunk, as LeadServer groups them (DEFAULT_RELAY_CHUNK_BYTES); each
    # chunk is added pipelined (SSAServer.add_clients: the next client is decoded while this one
    # is evaluated) where the library has it, else client by client (a baseline tree's library).
    per_chunk = max(1, DEFAULT_RELAY_CHUNK_BYTES // (len(uploads[0].public_part) + 1024))
    pipelined = hasattr(ssa.SSAServer, "add_clients")
    out["per_chunk"] = per_chunk if pipelined else 1

    def one_round(p: int) -> tuple[float, float]:
        server = ssa.SSAServer(params, p, digest_key=key)
        start, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, clients, per_chunk):
            chunk = range(lo, min(clients, lo + per_chunk))
            if pipelined:
                items = [
                    ssa.ClientKeys(c, uploads[c % 2].public_part, uploads[c % 2].master_seeds[p])
                    for c in chunk
                ]
                server.add_clients(items)
            else:
                for c in chunk:
                    upload = uploads[c % 2]
                    server.add_client(c, upload.public_part, upload.master_seeds[p])
            server.forget_recent()  # as LeadServer after each relayed chunk
        server.share()
        wall = (time.perf_counter() - start) / clients
        return wall, (time.process_time() - cpu) / clients

    for party in (0, 1):  # untimed: a long-running server has its buffers' pages already
        one_round(party)
    # The parties' timed rounds alternate (S0 first, then S1 first, ...): neither is always
    # measured right after the warm-up (before session 29 S0's rounds always came first).
    timed: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    for r in range(ROUNDS):
        for party in (0, 1) if r % 2 == 0 else (1, 0):
            timed[party].append(one_round(party))
    for party in (0, 1):
        out[f"s{party}_ms"] = 1e3 * min(w for w, _ in timed[party])
        out[f"s{party}_cpu_ms"] = 1e3 * min(c for _, c in timed[party])
        floor = aes_floor(
            lambda p=party: ssa.SSAServer(params, p, threads=1, digest_key=key).add_client(
                0, uploads[0].public_part, uploads[0].master_seeds[p]
            )
        )
        out[f"s{party}_aes_ms"] = 1e3 * floor["replay_s"]
        out[f"s{party}_aes_blocks"] = floor["blocks"]
    if cores == 1:
        for party in (0, 1):
            total, serial = _serial_split(lambda p=party: one_round(p))
            out[f"s{party}_serial"] = [1e3 * total / clients, 1e3 * serial / clients]
    out["hash_ms"] = 1e3 * _hash_floor(params, table, key) if verify else 0.0
    out["threads"] = ssa.SSAServer(params, 0).threads
    if kind == "checked-v3":
        idx, vals, _ = client_inputs(m, k, rng)

        def encode() -> object:
            return ssa.encode_update(params, idx, vals, rng=rng, simple_table=table)

        encode()
        out["encode_ms"] = 1e3 * min(_timed(encode) for _ in range(3))
        out["encode_aes_ms"] = 1e3 * aes_floor(encode)["replay_s"]
    return out


def _serial_split(round_fn: Callable[[], object]) -> tuple[float, float]:
    """One round's CPU seconds on one thread: ``(all, outside the server's thread pool)``.

    Every top-level ``run_ranges`` call of the library (:func:`flwr_fsl.core.threads.
    run_ranges`: the work the server spreads over its threads) of two or more calls is timed
    (a single call runs in the caller: the share's scatter, one window at ``tau = 2`` on any
    thread count, :data:`~flwr_fsl.families.ssa.server_eval.SCATTER_SPLIT_BYTES`, was counted
    as pool work before session 35; a larger share, which two threads would scatter in two
    windows, now counts as serial, an overestimate), and every ``prepare``
    of :func:`flwr_fsl.core.threads.pipelined` but a chunk's first (on two or more threads it
    runs on the pool, beside the evaluation of the client before); the rest runs on the calling
    thread alone whatever the thread count (Amdahl's serial part). ``start_ranges`` calls (the
    key check's segments, queued without waiting) are timed as ``run_ranges`` calls. A server
    that streams on two or more threads (:attr:`~flwr_fsl.families.ssa.protocol.SSAServer.
    streams`, session 39) settles each client in the caller while its pool evaluates the next
    one, so there most of this serial part overlaps pool work: an upper bound. Thread CPU time,
    so it stays near the work done on a loaded machine.
    """
    from flwr_fsl.families.ssa import verify

    original = verify.run_ranges
    inside = [0.0, 0]

    def counting(fn: Callable[..., object]) -> Callable[..., object]:
        """``fn`` (``run_ranges`` or ``start_ranges``) on one thread, timed as pool work."""

        def counted(work: Callable[[int], object], count: int, threads: int, *pool: str) -> object:
            if inside[1] or count <= 1:  # one call runs in the caller alone on any thread count
                return fn(work, count, 1, *pool)
            inside[1] = 1
            start = time.thread_time()
            try:
                return fn(work, count, 1, *pool)  # (start_ranges: done before it returns)
            finally:
                inside[0] += time.thread_time() - start
                inside[1] = 0

        return counted

    from flwr_fsl.core import threads

    pipe = getattr(threads, "pipelined", None)  # None: a library without it (a baseline tree)
    begin = getattr(threads, "start_ranges", None)  # (queued ranges: the key check, session 39)

    def counted_pipe(
        items: list[object], prepare: Callable[[object], object], use: object, n: int, *pool: str
    ) -> list[object]:
        """``pipelined`` on one thread; every ``prepare`` but the first counts as pool work."""

        def timed(item: object) -> object:
            if item is items[0]:  # a chunk's first client: decoded in the caller alone
                return prepare(item)
            start = time.thread_time()
            try:
                return prepare(item)
            finally:
                inside[0] += time.thread_time() - start

        assert pipe is not None
        return pipe(items, timed, use, 1, *pool)  # type: ignore[arg-type]

    counters = {
        "run_ranges": counting(original),
        "pipelined": counted_pipe,
        "start_ranges": counting(begin) if begin is not None else None,
    }
    patched = [
        (mod, attr, counters[attr], was)
        for name, mod in list(sys.modules.items())
        if name.startswith("flwr_fsl") and name != "flwr_fsl.core.threads"
        for attr, was in (("run_ranges", original), ("pipelined", pipe), ("start_ranges", begin))
        if was is not None and getattr(mod, attr, None) is was
    ]
    for mod, attr, new, _ in patched:
        setattr(mod, attr, new)
    try:
        start = time.thread_time()
        round_fn()
        total = time.thread_time() - start
    finally:
        for mod, attr, _, was in patched:
            setattr(mod, attr, was)
    return total, total - inside[0]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _hash_floor(params: ssa.SSAParams, table: object, key: bytes | None) -> float:
    """Hash time of one client's key-check proofs (same bytes, segments and hash; one thread)."""
    lengths = key_lengths(params, table)  # type: ignore[arg-type]
    check = KeyCheck(params, 0, lengths, threads=1, digest_key=key)
    sizes = [int(check.offsets[b] - check.offsets[a]) * 8 * PROOF_WORDS for a, b in check.segments]
    buf = np.random.default_rng(0).integers(0, 2**63, max(sizes) // 8, dtype=np.int64).tobytes()
    view = memoryview(buf)
    mac = AESGCM(key) if key is not None else None

    def run() -> None:
        for j, n in enumerate(sizes):
            if mac is not None:
                mac.encrypt(_NONCE.pack(0, j), b"", view[:n])
            else:
                hashlib.sha256(view[:n]).digest()

    return min(_timed(run) for _ in range(3))


def _run(args: argparse.Namespace, kind: str, cores: int, tree: str | None) -> dict[str, object]:
    """One configuration in a child process; ``tree``: the library from another checkout."""
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        f"--log-m={args.log_m}",
        f"--rate={args.rate}",
        f"--clients={args.clients}",
        f"--rounds={args.rounds}",
        f"--cores={cores}",
        f"--kind={kind}",
    ]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(Path(tree).resolve())
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_rows(label: str, rows: dict[int, dict[str, object]]) -> dict[str, float]:
    """Print one round kind's table rows; return the most cores' worse party's ratio and speed-up.

    The worse party: the larger ratio to its AES floor and, apart, the smaller speed-up (the
    target holds for both servers).
    """
    last: dict[str, float] = {}
    for c, row in rows.items():
        hashed = float(row["hash_ms"])  # type: ignore[arg-type]
        for party in (0, 1):
            ms = float(row[f"s{party}_ms"])  # type: ignore[arg-type]
            aes = float(row[f"s{party}_aes_ms"])  # type: ignore[arg-type]
            blocks = float(row[f"s{party}_aes_blocks"])  # type: ignore[arg-type]
            one = float(rows[1][f"s{party}_ms"])  # type: ignore[arg-type]
            print(
                f"| {label} | {c} ({row['threads']}) | S{party} | {ms:.1f} | "
                f"{float(row[f's{party}_cpu_ms']):.1f} | {aes:.1f} "  # type: ignore[arg-type]
                f"({blocks / 1e6:.2f}M) | {ms / aes:.2f} | {hashed:.1f} | "
                f"{ms / (aes + hashed):.2f} | {one / ms:.2f} |"
            )
            if c != last.get("cores"):
                last = {"ratio": 0.0, "speedup": float("inf"), "cores": c}
            if ms / aes > last["ratio"]:
                last.update(ratio=ms / aes, ratio_party=party)
            if one / ms < last["speedup"]:
                last.update(speedup=one / ms, speedup_party=party)
    return last


def _compare(
    title: str, old: dict[int, dict[str, object]], new: dict[int, dict[str, object]]
) -> None:
    """Print wall and CPU ms per client, ``old -> new``, per core count and party.

    The CPU figure (all threads of the child) stays near the work done on a loaded machine,
    where the wall figure also counts the time other processes held the cores.
    """
    for c in sorted(new):
        for what, key in (("wall", "ms"), ("CPU", "cpu_ms")):
            print(
                f"{title}, same run, {c} core(s), {what}: "
                + ", ".join(
                    f"S{p} {float(old[c][f's{p}_{key}']):.1f} -> "  # type: ignore[arg-type]
                    f"{float(new[c][f's{p}_{key}']):.1f} ms "  # type: ignore[arg-type]
                    f"({float(old[c][f's{p}_{key}']) / float(new[c][f's{p}_{key}']):.2f}x)"  # type: ignore[arg-type]
                    for p in (0, 1)
                )
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="clients per round (8)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="timed rounds per configuration, best taken (1)"
    )
    parser.add_argument("--log-m", type=int, default=20, help="log2 m (20)")
    parser.add_argument("--rate", type=float, default=0.10, help="k/m (0.10)")
    parser.add_argument(
        "--kinds",
        default=",".join(_KINDS),
        help=f"round kinds to run, comma-separated (default all: {','.join(_KINDS)})",
    )
    parser.add_argument(
        "--baseline-tree",
        default=None,
        help="another checkout (e.g. a git worktree of main): every kind also runs on its "
        "library, same run, and the rows and ratios are printed beside this tree's",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="checked-v3", help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global ROUNDS
    ROUNDS = max(1, args.rounds)
    if args.worker:
        print(json.dumps(_worker(args.log_m, args.rate, args.clients, args.kind, args.cores)))
        return
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(_KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {list(_KINDS)}")
    cores = min(2, len(os.sched_getaffinity(0)))
    print(f"SSA round, m = 2^{args.log_m}, k/m = {args.rate:.0%}, {args.clients} clients")
    if args.baseline_tree:
        print(f"baseline rows ('base'): the library of {Path(args.baseline_tree).resolve()}")
    print(f"load average before: {_loadavg()}")
    print(
        "| round | cores (threads) | party | ms per client | CPU ms per client | AES floor ms "
        "(blocks) | / floor | hash ms | / AES+hash | 2-core speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    last: dict[str, float] = {}
    encode: dict[str, float] = {}
    per_kind: dict[str, dict[int, dict[str, object]]] = {}
    base: dict[str, dict[int, dict[str, object]]] = {}
    for kind in kinds:
        if args.baseline_tree:  # the baseline first, then this tree: the same conditions
            base[kind] = {c: _run(args, kind, c, args.baseline_tree) for c in sorted({1, cores})}
            _print_rows(f"{kind} (base)", base[kind])
        rows = per_kind[kind] = {c: _run(args, kind, c, None) for c in sorted({1, cores})}
        got = _print_rows(kind, rows)
        if kind == "checked-v3" or not last:
            last = got
        if "encode_ms" in rows[1]:
            encode = {k: float(rows[1][k]) for k in ("encode_ms", "encode_aes_ms")}  # type: ignore[arg-type]
    for label, rows in [(f"{k} (base)", base[k][1]) for k in kinds if k in base] + [
        (k, per_kind[k][1]) for k in kinds
    ]:
        parts = []
        for p in (0, 1):
            total, serial = rows[f"s{p}_serial"]  # type: ignore[misc]
            bound = total / (serial + (total - serial) / cores)
            parts.append(
                f"S{p} {serial:.1f} of {total:.1f} ms ({100 * serial / total:.1f}%, "
                f"Amdahl bound on {cores} cores {bound:.2f})"
            )
        print(f"serial CPU per client outside the server's threads, {label}: " + ", ".join(parts))
    for kind in kinds:
        chunk = per_kind[kind][1].get("per_chunk", 1)
        was = f"; baseline {base[kind][1].get('per_chunk', 1)}" if kind in base else ""
        print(f"{kind}: clients per add_clients chunk (pipelined; 1: one at a time) {chunk}{was}")
    for kind in kinds:
        if kind in base:
            _compare(f"{kind}: baseline -> this tree", base[kind], per_kind[kind])
    if {"checked-v2", "checked-v3"} <= set(kinds):
        _compare("digest v2 (SHA-256) -> v3 (GMAC)", per_kind["checked-v2"], per_kind["checked-v3"])
    if {"checked-v3-py", "checked-v3"} <= set(kinds):
        _compare(
            "checked driver Python -> native", per_kind["checked-v3-py"], per_kind["checked-v3"]
        )
    if {"checked-v3-keys", "checked-v3"} <= set(kinds):
        _compare(
            "key check alone -> with the projected value check (the default)",
            per_kind["checked-v3-keys"],
            per_kind["checked-v3"],
        )
    print(f"load average after: {_loadavg()}")
    if encode:
        ok = encode["encode_ms"] <= 40.0
        print(
            f"client encode: {encode['encode_ms']:.1f} ms (AES-only {encode['encode_aes_ms']:.1f} "
            f"ms; target <= 40 ms: {'PASS' if ok else 'FAIL'})"
        )
    ok_ratio, ok_speed = last["ratio"] <= 3.2, last["speedup"] >= 1.8
    which = "checked-v3" if "checked-v3" in kinds else kinds[0]
    print(
        f"server per client / AES floor: {last['ratio']:.2f} ({which}, "
        f"S{last['ratio_party']:.0f}, the worse server; "
        f"target <= 3.2: {'PASS' if ok_ratio else 'FAIL'})"
    )
    print(
        f"2-core speed-up: {last['speedup']:.2f} (S{last['speedup_party']:.0f}, the worse server, "
        f"on {last['cores']:.0f} cores; target >= 1.8: "
        f"{'PASS' if ok_speed else 'FAIL'})"
    )


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # pragma: no cover - not Linux
        return "n/a"


if __name__ == "__main__":
    main()
