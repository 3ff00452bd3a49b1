"""DPF engine benchmark: AES floor, Gen, full-domain evaluation, and sycret for comparison.

Run ``python benchmarks/dpf_bench.py [--json PATH] [--quick]``. Everything runs on one core
(the process pins itself to one CPU where the OS allows it); times are process CPU
time, best of 3 (5 for the AES-only replays). Prints a table and the bars of
issues 3 and 26, and writes the numbers as JSON (default ``benchmarks/results/dpf_bench.json``).

* AES-ECB floor: ``BatchedAES.encrypt_prefix_into`` on a cache-sized buffer (blocks/s).
* Gen: ``generate_keys_batch`` keys/s at depth 6, 9, 20 (tau = 1).
* Full-domain eval: ``evaluate_batch`` leaves/s for 100k keys at depth 9 and one key at depth 20
  (and 100k keys of depths 4..9), on the native driver (the chunk loop in one numba call,
  OpenSSL called from it) and, in the same run, on the Python driver it replaced.
* AES-only time for the same blocks: every AES call an evaluation makes (left-, right- and
  value-key ciphers of the MMO PRG alike) is recorded (sizes; the Python driver's are also
  timed in place); the recorded calls are then replayed alone, in the same order, with the
  same sizes, from one hot buffer, through the native entry point (no Python between calls:
  the strictest floor) and through ``cryptography``'s ``update_into`` (the floor used before).
  The ratio is eval time / replayed AES time; the load average is printed beside it (the
  ratios move with the load of the other core: compare the two drivers within one run).
* ``--breakdown``: the native chunk loop timed with parts of it switched off
  (``dpf._FD_PARTS``): its AES calls alone (in place), its tree-level passes alone, its leaf
  conversion with the output write alone, and the output's bytes written alone with
  non-temporal stores (the memory-bandwidth floor of a consumer that takes the output array).
* ``--baseline-tree PATH``: the three full-domain evaluations also run on the code in
  ``PATH`` (a checkout of another commit, in a subprocess, before and after this tree's
  timings; best of both), printed beside this tree's as a same-run speed-up.
* sycret (OpenMined's Rust FSS, ``EqFactory``): a DPF on a fixed 32-bit domain with no
  full-domain evaluation, so "full domain" is emulated with one point evaluation per leaf (each
  walks all 32 levels); keygen cannot choose a depth (always 32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.prg import MMOCiphers, _mmo_ciphers
from flwr_fsl.kernels.aes import BatchedAES, native_aes, native_replay

U64 = np.uint64


def best_of(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best of ``repeat`` runs in process CPU time (time the OS gave to other work is left out)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


class RecordingAES:
    """Wraps one MMO BatchedAES: records each call's size and its in-place time.

    The left, right and value ciphers of the MMO PRG share one ``sizes`` list (in call order)
    and one time accumulator (``clock``), so the replay repeats every AES call of the run.
    One lock serializes the calls: the recorders replace every thread's ciphers, and one
    ``BatchedAES`` context must not be used by two threads at once (the SSA servers evaluate
    on several threads); floors are recorded on one thread where timing in place matters.
    """

    _lock = threading.Lock()

    def __init__(
        self, inner: BatchedAES, sizes: list[int] | None = None, clock: list[float] | None = None
    ) -> None:
        self.inner = inner
        self.sizes: list[int] = [] if sizes is None else sizes
        self._clock = [0.0] if clock is None else clock

    @property
    def seconds(self) -> float:
        """In-place AES seconds accumulated by every recorder sharing this clock."""
        return self._clock[0]

    @seconds.setter
    def seconds(self, value: float) -> None:
        self._clock[0] = value

    def encrypt_prefix_into(self, blocks: np.ndarray, out: np.ndarray) -> None:
        """Time and record one no-copy call."""
        with self._lock:
            t = time.perf_counter()
            self.inner.encrypt_prefix_into(blocks, out)
            self.seconds += time.perf_counter() - t
            self.sizes.append(blocks.nbytes // 16)

    def encrypt_view_into(self, src: memoryview, dst: memoryview) -> None:
        """Time and record one raw-bytes call."""
        with self._lock:
            t = time.perf_counter()
            self.inner.encrypt_view_into(src, dst)
            self.seconds += time.perf_counter() - t
            self.sizes.append(src.nbytes // 16)

    def encrypt_into(self, blocks: np.ndarray, out: np.ndarray) -> None:
        """Time and record one copying call."""
        with self._lock:
            t = time.perf_counter()
            self.inner.encrypt_into(blocks, out)
            self.seconds += time.perf_counter() - t
            self.sizes.append(blocks.nbytes // 16)


def replay_aes(sizes: list[int], native: bool | None = None) -> float:
    """Time the same sequence of AES calls alone, from one hot buffer (best of 3).

    With ``native`` (the default wherever OpenSSL loads natively) the calls go through
    :func:`~flwr_fsl.kernels.aes.native_replay`: ``EVP_EncryptUpdate`` from numba, no Python
    between calls, the entry point of the native evaluation driver and the strictest floor.
    With ``native=False`` they go through ``cryptography``'s ``update_into`` from Python (the
    floor this benchmark used before the native driver; about 0.7 us more per call).
    """
    cap = max(sizes, default=1)
    src = np.random.default_rng(0).integers(0, 2**63, (cap, 2)).astype(U64)
    dst = np.empty((cap + 1, 2), dtype=U64)
    nat = native_aes(bytes(16)) if native is not False else None
    if nat is not None:
        arr = np.asarray(sizes, dtype=np.int64)
        return best_of(lambda: native_replay(nat.fn, nat.ctx, src, dst, arr), 5)
    aes = BatchedAES(bytes(16))
    src_mv, dst_mv = src.data.cast("B"), dst.data.cast("B")

    def run() -> None:
        for n in sizes:
            aes.encrypt_view_into(src_mv[: 16 * n], dst_mv)

    return best_of(run, 5)


def record_aes(fn: Callable[[], Any]) -> RecordingAES:
    """Run ``fn`` once with every DPF AES call (left, right, value, proof ciphers) recorded.

    Calls through the ``cryptography`` ciphers are timed in place; calls the native driver
    makes from numba are logged (``dpf._AES_LOG``) into the same ``sizes`` list, untimed.
    """
    ciphers = _mmo_ciphers()
    rec = RecordingAES(ciphers.value)
    left = RecordingAES(ciphers.left, rec.sizes, rec._clock)
    right = RecordingAES(ciphers.right, rec.sizes, rec._clock)
    proof = RecordingAES(ciphers.proof, rec.sizes, rec._clock)
    recorders = MMOCiphers(left, right, rec, proof)  # type: ignore[arg-type]
    original = dpf._mmo_ciphers
    dpf._mmo_ciphers = lambda: recorders
    dpf._AES_LOG = rec.sizes
    try:
        fn()
    finally:
        dpf._mmo_ciphers = original
        dpf._AES_LOG = None
    return rec


def python_driver(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the evaluation forced onto the Python driver (the path before issue 26)."""

    def run() -> Any:
        dpf._NATIVE_AES = False
        try:
            return fn()
        finally:
            dpf._NATIVE_AES = True

    return run


def eval_with_aes_ratio(fn: Callable[[], Any]) -> dict[str, float]:
    """Time ``fn`` on both drivers (best of 3, interleaved), then its AES calls alone.

    Both drivers make the same AES calls (same sizes, same order); the ratios divide each
    evaluation time by the replayed AES time of those calls (native floor and the old
    ``cryptography`` floor).
    """
    old = python_driver(fn)
    total = total_old = float("inf")
    for _ in range(2):
        total = min(total, best_of(fn))
        total_old = min(total_old, best_of(old))
    rec = record_aes(fn)
    rec_old = record_aes(old)
    if rec_old.sizes != rec.sizes:  # pragma: no cover - the drivers disagree
        raise RuntimeError("the native and Python drivers made different AES calls")
    replay = replay_aes(rec.sizes)
    replay_py = replay_aes(rec.sizes, native=False)
    return {
        "seconds": total,
        "seconds_python_driver": total_old,
        "aes_blocks": sum(rec.sizes),
        "aes_calls": len(rec.sizes),
        "aes_in_place_python_driver_s": rec_old.seconds,
        "aes_replay_s": replay,
        "aes_replay_cryptography_s": replay_py,
        "ratio": total / replay,
        "ratio_python_driver": total_old / replay,
        "ratio_old_floor": total / replay_py,
        "ratio_python_driver_old_floor": total_old / replay_py,
        "speedup": total_old / total,
    }


def eval_cases(n_eval: int) -> dict[str, tuple[Callable[[], Any], int]]:
    """Return the three full-domain evaluations: name -> (run, output points).

    100k (``n_eval``) keys at depth 9, one key at depth 20, 100k keys of depths 4..9; each
    evaluates into a preallocated output (a fresh one costs its page faults in every run).
    """
    rng = np.random.default_rng(3)
    alphas = rng.integers(0, 512, n_eval).astype(U64)
    k9, _ = dpf.generate_keys_batch(alphas, np.ones(n_eval, U64), 9)
    out9 = np.empty((n_eval * 512, 1), dtype=U64)
    k20, _ = dpf.generate_keys(123_456, 7, 20)
    b20 = k20.as_batch()
    out20 = np.empty((1 << 20, 1), dtype=U64)
    mixed_d = rng.integers(4, 10, n_eval)
    km, _ = dpf.generate_keys_batch(
        rng.integers(0, 2**62, n_eval).astype(U64) % (U64(1) << mixed_d.astype(U64)),
        np.ones(n_eval, U64),
        mixed_d,
    )
    n_m = int((np.int64(1) << mixed_d).sum())
    outm = np.empty((n_m, 1), dtype=U64)
    return {
        "depth9_100k": (lambda: dpf.evaluate_batch(k9, out=out9), n_eval * 512),
        "depth20_1": (lambda: dpf.evaluate_batch(b20, out=out20), 1 << 20),
        "mixed4to9_100k": (lambda: dpf.evaluate_batch(km, out=outm), n_m),
    }


def eval_only(n_eval: int, path: str) -> None:
    """Time the three evaluations alone (best of 3, twice) and write ``{name: s}`` to ``path``.

    The ``--baseline-tree`` subprocess: it uses only ``generate_keys*`` and
    ``evaluate_batch``, so it runs on older checkouts too.
    """
    res = {}
    for name, (fn, _) in eval_cases(n_eval).items():
        fn()
        res[name] = min(best_of(fn), best_of(fn))
    Path(path).write_text(json.dumps(res))


def run_baseline(tree: str, n_eval: int) -> dict[str, float]:
    """Run :func:`eval_only` on the code in ``tree`` (a subprocess pinned to this CPU)."""
    out = Path(tempfile.mkdtemp()) / "baseline.json"
    cmd = [sys.executable, __file__, "--eval-only", str(out), "--n-eval", str(n_eval)]
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    subprocess.run(cmd, env=env, check=True)
    res: dict[str, float] = json.loads(out.read_text())
    return res


def breakdown(fn: Callable[[], Any], words: int) -> dict[str, float]:
    """Time the native chunk loop's parts alone (``dpf._FD_PARTS``) and the output write alone.

    ``aes``: the tree's and the value key's AES calls in place (the same calls, from the same
    buffers, nothing between them); ``levels``: the tree-level passes; ``leaves``: the leaf
    conversion with its output write; ``write``: ``words`` output words written alone with
    non-temporal stores (the memory traffic any consumer of the output array pays).
    """
    from numba import njit

    from flwr_fsl.kernels.dpf_kernels import store_fence
    from flwr_fsl.kernels.dpf_vectors import _store_nt

    @njit(cache=False)
    def nt_fill(out: np.ndarray) -> None:  # pragma: no cover - numba
        for i in range(out.shape[0]):
            _store_nt(out, np.uint64(i), np.uint64(i))
        store_fence()

    res = {}
    try:
        for name, parts in (("aes", 1 | 4), ("levels", 2), ("leaves", 8)):
            dpf._FD_PARTS = parts
            fn()
            res[name] = best_of(fn)
    finally:
        dpf._FD_PARTS = 15
    buf = np.empty(words, dtype=U64)
    nt_fill(buf)
    res["write"] = best_of(lambda: nt_fill(buf))
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/results/dpf_bench.json")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument("--breakdown", action="store_true", help="time the loop's parts alone")
    parser.add_argument("--baseline-tree", help="also time the evaluations on this checkout")
    parser.add_argument("--eval-only", help=argparse.SUPPRESS)  # the baseline subprocess
    parser.add_argument("--n-eval", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    n_eval = args.n_eval or (10_000 if args.quick else 100_000)
    if args.eval_only:
        eval_only(n_eval, args.eval_only)
        return
    base_runs = [run_baseline(args.baseline_tree, n_eval)] if args.baseline_tree else []
    n_gen = {6: 200_000, 9: 200_000, 20: 50_000}
    if args.quick:
        n_gen = {k: v // 10 for k, v in n_gen.items()}
    res: dict[str, Any] = {"machine": platform.processor() or platform.machine()}
    rows: list[tuple[str, str, str]] = []

    # Warm up numba (cached compile / load) outside every timing.
    w0, _ = dpf.generate_keys_batch([1, 2], [3, 4], [9, 20])
    dpf.evaluate_batch(w0)
    dpf.evaluate_at_batch(w0, [0, 1], [1, 2])

    # AES floor.
    aes = BatchedAES(bytes(16))
    n_floor = 1 << 15
    src = np.random.default_rng(1).integers(0, 2**63, (n_floor, 2)).astype(U64)
    dst = np.empty((n_floor + 1, 2), dtype=U64)
    src_mv, dst_mv = src.data.cast("B"), dst.data.cast("B")
    reps = 200

    def floor_run() -> None:
        for _ in range(reps):
            aes.encrypt_view_into(src_mv, dst_mv)

    floor = n_floor * reps / best_of(floor_run)
    res["aes_floor_blocks_per_s"] = floor
    rows.append(("AES-ECB floor (2^15-block calls)", f"{floor:.3g} blocks/s", ""))

    # Gen.
    rng = np.random.default_rng(2)
    res["gen_keys_per_s"] = {}
    for depth, n in n_gen.items():
        alphas = rng.integers(0, 1 << depth, n).astype(U64)
        betas = rng.integers(0, 2**63, n).astype(U64)
        sec = best_of(lambda a=alphas, b=betas, d=depth: dpf.generate_keys_batch(a, b, d))
        res["gen_keys_per_s"][depth] = n / sec
        rows.append((f"Gen, depth {depth} ({n} keys, tau=1)", f"{n / sec:.3g} keys/s", ""))

    # Full-domain eval.
    cases = eval_cases(n_eval)
    fd: dict[str, dict[str, Any]] = {}
    for name, (fn, points) in cases.items():
        fd[name] = eval_with_aes_ratio(fn)
        fd[name]["leaves_per_s"] = points / fd[name]["seconds"]
        if args.breakdown:
            fd[name]["breakdown_s"] = breakdown(fn, points)
    if args.baseline_tree:
        base_runs.append(run_baseline(args.baseline_tree, n_eval))
        for name, r in fd.items():
            r["seconds_baseline_tree"] = min(b[name] for b in base_runs)
    r9, r20, rm = fd["depth9_100k"], fd["depth20_1"], fd["mixed4to9_100k"]
    leaves9, leaves20, leaves_m = (r["leaves_per_s"] for r in (r9, r20, rm))
    res["full_domain"] = fd
    for name, r, lv in (
        (f"Full-domain eval, {n_eval} keys depth 9", r9, leaves9),
        ("Full-domain eval, 1 key depth 20", r20, leaves20),
        (f"Full-domain eval, {n_eval} keys depth 4..9", rm, leaves_m),
    ):
        rows.append((name, f"{lv:.3g} leaves/s", f"{r['seconds'] * 1e3:.1f} ms"))
        rows.append(
            (
                "  Python driver (before issue 26), same run",
                f"{r['speedup']:.2f}x slower",
                f"{r['seconds_python_driver'] * 1e3:.1f} ms",
            )
        )
        rows.append(
            (
                "  AES calls alone, same blocks",
                f"{r['aes_blocks']} blocks / {r['aes_calls']} calls",
                f"{r['aes_replay_s'] * 1e3:.1f} ms native"
                f" ({r['aes_replay_cryptography_s'] * 1e3:.1f} via cryptography)",
            )
        )
        rows.append(
            (
                "  eval time / AES-only time",
                f"{r['ratio']:.2f}x",
                f"Python driver {r['ratio_python_driver']:.2f}x; on the cryptography floor "
                f"{r['ratio_old_floor']:.2f}x and {r['ratio_python_driver_old_floor']:.2f}x",
            )
        )
        if "seconds_baseline_tree" in r:
            old = r["seconds_baseline_tree"]
            rows.append(
                (
                    f"  {args.baseline_tree}, same run",
                    f"{old / r['seconds']:.2f}x slower",
                    f"{old * 1e3:.1f} ms ({old / r['aes_replay_s']:.2f}x its AES calls)",
                )
            )
        if "breakdown_s" in r:
            bd = {k: f"{v * 1e3:.1f}" for k, v in r["breakdown_s"].items()}
            rows.append(
                (
                    "  parts alone: AES / levels / leaves+output",
                    f"{bd['aes']} / {bd['levels']} / {bd['leaves']} ms",
                    f"output write alone {bd['write']} ms (non-temporal)",
                )
            )

    # sycret.
    sy: dict[str, Any] = {}
    try:
        import sycret  # type: ignore[import-not-found]

        eq = sycret.EqFactory(n_threads=1)
        n_kg = 20_000 if not args.quick else 2_000
        kg = n_kg / best_of(lambda: eq.keygen(n_kg))
        sy["keygen_per_s"] = kg
        rows.append(("sycret keygen (fixed 32-bit domain)", f"{kg:.3g} keys/s", ""))
        keys_a, _ = eq.keygen(1)
        chunk = 1 << 15
        rep = np.repeat(keys_a, chunk, axis=0)

        def sy_points(n_points: int) -> float:
            t = time.perf_counter()
            for lo in range(0, n_points, chunk):
                m = min(chunk, n_points - lo)
                xs = np.arange(lo, lo + m, dtype=np.int64)
                eq.eval(0, xs, rep[:m], n_threads=1)
            return time.perf_counter() - t

        n20 = 1 << 20 if not args.quick else 1 << 16
        sec20 = sy_points(n20)
        sy["full_domain_depth20_leaves_per_s"] = n20 / sec20
        rows.append(
            (
                "sycret full-domain emulated, depth 20",
                f"{n20 / sec20:.3g} leaves/s",
                f"{n20} point evals, {sec20:.2f} s",
            )
        )
        n9 = 512 * 200
        sec9 = sy_points(n9)
        sy["full_domain_depth9_leaves_per_s"] = n9 / sec9
        rows.append(
            (
                "sycret full-domain emulated, depth 9",
                f"{n9 / sec9:.3g} leaves/s",
                "200 keys x 512 points, extrapolated",
            )
        )
    except ImportError:  # pragma: no cover - optional dependency
        rows.append(("sycret", "not installed", ""))
    res["sycret"] = sy

    width = max(len(r[0]) for r in rows)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    res["load_average"] = load
    print(f"DPF benchmark (one core; {res['machine']}; load average {load[0]:.2f} {load[1]:.2f})")
    for a, b, c in rows:
        print(f"{a:<{width}}  {b:>28}  {c}")

    bars = [
        ("full-domain eval <= 1.3x AES-only (100k x depth 9)", r9["ratio"] <= 1.3, r9["ratio"]),
        ("full-domain eval <= 1.3x AES-only (1 x depth 20)", r20["ratio"] <= 1.3, r20["ratio"]),
    ]
    if "full_domain_depth20_leaves_per_s" in sy:
        speedup = leaves20 / sy["full_domain_depth20_leaves_per_s"]
        bars.append(("depth-20 full domain >= 100x sycret", speedup >= 100, speedup))
    gen9 = res["gen_keys_per_s"][9]
    bars.append(("Gen >= 1M keys/s at depth 9", gen9 >= 1e6, gen9))
    print("\nBars:")
    for name, ok, value in bars:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {value:.3g}")
    res["bars"] = {name: {"met": bool(ok), "value": float(v)} for name, ok, v in bars}
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2, default=float))
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
