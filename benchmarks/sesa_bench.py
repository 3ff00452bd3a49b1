"""SESA per-user computation and communication at N ∈ {20, 50, 100} vs Theorems 1–2.

Run ``python benchmarks/sesa_bench.py [--clients 20 50 100] [--repeats 3] [--json PATH]
[--relay-mib 400]``. The setting is the paper's §VI on the MLP 784-200-10: the hidden layer
is split into ``K = 4`` shards of 50 nodes (``B_min = 1/4``), a shard vector holds the 50
nodes' input weights (784 each), biases and output weights (10 each) plus one count word,
``d = 50 · (784 + 1 + 10) + 1 = 39,751`` words; the output bias (10 + 1 words) is a second
group with ``K = 1`` that every user selects. Users fall in three capacity groups
``B_i ∈ {1, 1/2, 1/4}`` (``K_i = 4, 2, 1``; ``⌊N/3⌋``, ``⌊N/3⌋`` and the rest), ``T = N/2``,
``p = 2^32 - 5``. Two measurements per ``N``:

* **Per user, full size** (one user of each capacity, median of ``--repeats``): the offline
  phase (draws, selector and mask evaluations at all ``N`` points, sealing) and the online
  phase (the masked update, then ``ψ(α_i)`` from an evaluation request holding every other
  user's masked update and sealed evaluations of the real sizes — random field words, since
  the work does not depend on their values). Bytes come from the protocol messages
  themselves (Flower's framing is not included). Theorem 1's words are ``N K_i d`` offline
  and ``K_i d`` online (``d = d'/K``, the shard length); the table prints measured bytes over
  4 bytes × those words. Theorem 2: online ``O(N d)``; offline, this implementation does one
  ``(N × T) @ (T × K_i d)`` field product, ``O(N T K_i d)``, not the fast multipoint
  evaluation behind the theorem's ``O(N K_i d log²(K+T) log log(K+T))``: the table prints
  time per ``N K_i d`` and per ``N T K_i d`` word operation.
* **A whole round** of ``N`` users through :class:`~flwr_fsl.families.sesa.protocol.SesaServer`
  (10% of the users lost: half after the offline phase, half after their masked update), with
  the shard length divided by a power of two so that the server's relay mailbox stays under
  ``--relay-mib`` (it holds ``N²`` sealed evaluations); the decoded per-shard sums are checked
  to equal the plaintext sums exactly, and the server's time is reported at that length.

Writes JSON (default ``benchmarks/results/sesa_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from flwr_fsl.crypto.channel import SealingKeyPair, client_party
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.sealing import seal_for
from flwr_fsl.families.sesa import protocol as sesa
from flwr_fsl.families.sesa.protocol import (
    SesaClient,
    SesaGroup,
    SesaParams,
    SesaServer,
    bundle_bytes,
    choose_shards,
)

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
K = 4
NODES, INPUTS, OUTPUTS = 200, 784, 10
SHARD_WORDS = NODES // K * (INPUTS + 1 + OUTPUTS) + 1  # 39,751 with the count word
BIAS_WORDS = OUTPUTS + 1


def capacities(n: int) -> list[int]:
    """``K_i`` of the ``n`` users: ``⌊n/3⌋`` with 4, ``⌊n/3⌋`` with 2, the rest with 1."""
    third = n // 3
    return [4] * third + [2] * third + [1] * (n - 2 * third)


def make_params(n: int, shard_words: int) -> SesaParams:
    """Return the round: hidden shards and the output bias, ``T = n/2``."""
    groups = (SesaGroup(K, shard_words), SesaGroup(1, BIAS_WORDS))
    return SesaParams(1, os.urandom(16), n // 2, groups)


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def per_user(n: int, slots: int, repeats: int) -> dict[str, float]:
    """Offline and online cost of one user with ``slots`` shards, full size."""
    params = make_params(n, SHARD_WORDS)
    f = params.field
    keys = {u: SealingKeyPair.generate() for u in range(n)}
    caps = capacities(n)
    prg = PRGStream.fresh()
    offline_s, mask_s, eval_s = [], [], []
    sizes: dict[str, int] = {}
    for _ in range(repeats):
        me = SesaClient(0, params, (choose_shards(K, slots), (0,)), key=keys[0])
        roster = sesa._roster_to_bytes({u: k.public_bytes for u, k in keys.items()})
        bundle, t_off = _timed(lambda me=me, roster=roster: me.offline(roster))
        updates = [f.random((slots, SHARD_WORDS), prg), f.random((1, BIAS_WORDS), prg)]
        everyone = list(range(n))
        masked, t_mask = _timed(lambda me=me, u=updates, e=everyone: me.masked_update(e, u))
        # Everything the server relays to user 0: every x, and every other user's sealed
        # evaluations for it, of the real sizes.
        xs = {0: masked}
        pieces = {}
        for j in range(1, n):
            k_j = caps[j]
            xs[j] = sesa._masked_to_bytes(
                [f.random((k_j, SHARD_WORDS), prg), f.random((1, BIAS_WORDS), prg)], params
            )
            plain = sesa._encode_piece(
                j,
                0,
                [f.random(k_j, prg), f.random(1, prg)],
                [f.random((k_j, SHARD_WORDS), prg), f.random((1, BIAS_WORDS), prg)],
            )
            pieces[j] = seal_for(
                keys[0].public_bytes,
                plain,
                purpose=sesa.PIECE_PURPOSE,
                binding=params.binding,
                sender=client_party(j),
                recipient=client_party(0),
            )
        request = sesa._request_to_bytes(sesa._Request(tuple(everyone), xs, pieces))
        evaluation, t_eval = _timed(lambda me=me, r=request: me.evaluate(r))
        offline_s.append(t_off)
        mask_s.append(t_mask)
        eval_s.append(t_eval)
        sizes = {
            "offline_up": len(bundle),
            "online_up": len(masked) + len(evaluation),
            "online_down": len(request),
        }
        assert len(bundle) == bundle_bytes(params, n, (slots, 1))
    t = params.privacy
    # Price Theorem 2's bound at this machine's field multiply-add: time the coding kernel
    # alone on this user's shapes ((N-1) points, T+1 terms, K_i d words) in the same process.
    basis = f.random((n - 1, K + t), prg)
    r_cal, v_cal = f.random((slots, SHARD_WORDS), prg), f.random((t, slots, SHARD_WORDS), prg)
    _, t_kernel = _timed(lambda: sesa.mask_evaluations(f, basis, tuple(range(slots)), r_cal, v_cal))
    direct_ops = (n - 1) * (t + 1) * slots * SHARD_WORDS
    thm2_ops = theorem2_ops(n, t, slots)
    words_off = n * slots * (SHARD_WORDS - 1)  # Theorem 1: N K_i d/K (model words)
    words_on = slots * (SHARD_WORDS - 1)
    off = statistics.median(offline_s)
    return {
        "n": n,
        "T": t,
        "slots": slots,
        "offline_s": off,
        "online_mask_s": statistics.median(mask_s),
        "online_eval_s": statistics.median(eval_s),
        "offline_up_mib": sizes["offline_up"] / MIB,
        "online_up_mib": sizes["online_up"] / MIB,
        "online_down_mib": sizes["online_down"] / MIB,
        "offline_vs_thm1": sizes["offline_up"] / (4 * words_off),
        "online_vs_thm1": sizes["online_up"] / (4 * words_on),
        "offline_ns_per_NKd": off / words_off * 1e9,
        "offline_ns_per_NTKd": off / (words_off * t) * 1e9,
        "online_eval_ns_per_Nd": statistics.median(eval_s) / (n * (SHARD_WORDS - 1)) * 1e9,
        "kernel_s": t_kernel,
        "direct_ops": direct_ops,
        "theorem2_ops": thm2_ops,
        "ops_vs_thm2": direct_ops / thm2_ops,
        "offline_vs_thm2": off / (thm2_ops * t_kernel / direct_ops),
    }


def theorem2_ops(n: int, t: int, slots: int) -> float:
    """Return Theorem 2's offline bound for one user, ``N K_i d log²(K+T) log log(K+T)``.

    Base-2 logarithms, no constant; ``d`` is the shard length (``d'/K`` in the paper).
    """
    m = K + t
    return n * slots * SHARD_WORDS * math.log2(m) ** 2 * max(1.0, math.log2(math.log2(m)))


def whole_round(n: int, relay_mib: float, seed: int) -> dict[str, float]:
    """One round of ``n`` users, 10% lost, at a shard length that keeps the relay small."""
    caps = capacities(n)
    scale = 1
    while True:
        words = max(2, SHARD_WORDS // scale)
        params = make_params(n, words)
        mailbox = sum(bundle_bytes(params, n, (k, 1)) for k in caps)
        if mailbox <= relay_mib * MIB:
            break
        scale *= 2
    f = params.field
    rng = np.random.default_rng(seed)
    prg = PRGStream(seed.to_bytes(16, "little"))
    nodes = list(range(1, n + 1))
    clients = {
        u: SesaClient(u, params, (choose_shards(K, caps[i]), (0,))) for i, u in enumerate(nodes)
    }
    lost = rng.choice(nodes, size=n // 10, replace=False).tolist()
    after_offline, after_masked = set(lost[0::2]), set(lost[1::2])
    server = SesaServer(params)
    server_s = client_s = 0.0

    def s(fn):  # type: ignore[no-untyped-def]
        nonlocal server_s
        out, dt = _timed(fn)
        server_s += dt
        return out

    def c(fn):  # type: ignore[no-untyped-def]
        nonlocal client_s
        out, dt = _timed(fn)
        client_s += dt
        return out

    for u, cl in clients.items():
        key = cl.advertise()
        s(lambda u=u, k=key: server.add_advertisement(u, k))
    roster = s(server.roster)
    for u, cl in clients.items():
        bundle = c(lambda cl=cl: cl.offline(roster))
        s(lambda u=u, b=bundle: server.add_bundle(u, b))
    u2 = s(server.sharers)
    updates = {
        u: [f.random((len(cl.shards[0]), words), prg), f.random((1, BIAS_WORDS), prg)]
        for u, cl in clients.items()
    }
    for u in u2:
        if u in after_offline:
            continue
        x = c(lambda u=u: clients[u].masked_update(u2, updates[u]))
        s(lambda u=u, x=x: server.add_masked(u, x))
    for u in server.survivors:
        request = s(lambda u=u: server.evaluation_request(u))
        if u in after_masked:
            continue
        y = c(lambda u=u, r=request: clients[u].evaluate(r))
        s(lambda u=u, y=y: server.add_evaluation(u, y))
    result = s(server.result)
    expected = [np.zeros((K, words), np.uint64), np.zeros((1, BIAS_WORDS), np.uint64)]
    for u in server.survivors:
        for slot, shard in enumerate(clients[u].shards[0]):
            expected[0][shard] = f.add(expected[0][shard], updates[u][0][slot])
        expected[1][0] = f.add(expected[1][0], updates[u][1][0])
    exact = all(np.array_equal(a, b) for a, b in zip(result, expected, strict=True))
    return {
        "n": n,
        "shard_words": words,
        "scale": scale,
        "lost": len(lost),
        "aggregated": len(server.survivors),
        "evaluations": len(server.evaluators),
        "exact": exact,
        "server_s": server_s,
        "client_s_mean": client_s / n,
    }


def _flower_app(seed: int):  # type: ignore[no-untyped-def]
    """Return a ClientApp: ``sesa_mod`` before a synthetic one-step trainer of the narrow MLP.

    The trainer adds a small deterministic delta (the secure round's cost does not depend on
    how the update was found; a real MNIST step would add the same time to every arm).
    """
    from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from flwr_fsl.mods import sesa_mod

    app = ClientApp(mods=[sesa_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rng = np.random.default_rng([seed, pid])
        arrays = msg.content["arrays"]
        new = {
            k: a.numpy() + (0.01 * rng.standard_normal(a.shape)).astype(np.float32)
            for k, a in arrays.items()
        }
        reply = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in new.items()}),
                "metrics": MetricRecord({"num-examples": 600}),
            }
        )
        return Message(reply, reply_to=msg)

    return app


def flower_round(n: int, seed: int = 0) -> dict[str, float]:
    """One secure SESA round of ``n`` users through Flower (``SesaFedAvg`` + ``sesa_mod``).

    :class:`~flwr_fsl.testing.InProcessGrid` (every message crosses as Flower's protobuf
    encoding), MLP 784-200-10, ``S = 4``, ``T = n/2``, capacities as :func:`capacities`; every
    user is sampled and none drops. Returns the wall time, this process's peak RSS and the
    traffic; run it in a fresh process for a clean peak.
    """
    import resource

    from flwr.app import Array, ArrayRecord

    from flwr_fsl.families.sesa.strategy import SesaFedAvg
    from flwr_fsl.testing import InProcessGrid

    caps = capacities(n)
    rng = np.random.default_rng(seed)
    model = {
        "fc1.weight": (0.05 * rng.standard_normal((NODES, INPUTS))).astype(np.float32),
        "fc1.bias": np.zeros(NODES, np.float32),
        "fc2.weight": (0.05 * rng.standard_normal((OUTPUTS, NODES))).astype(np.float32),
        "fc2.bias": np.zeros(OUTPUTS, np.float32),
    }
    grid = InProcessGrid(
        _flower_app(seed),
        n,
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": n,
            "width-rate": caps[i] / K,
        },
    )
    strategy = SesaFedAvg(
        num_shards=K, privacy=0.5, min_available_nodes=n, fraction_evaluate=0.0, sampling_seed=seed
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = time.process_time()
    start = time.perf_counter()
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
        num_rounds=1,
    )
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    state = strategy.round_state(1)
    traffic = {
        t.phase: (sum(t.down_bytes.values()) / MIB, sum(t.up_bytes.values()) / MIB)
        for t in state.traffic
    }
    return {
        "n": n,
        "T": n // 2,
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_rss_mib": peak / 1024,
        "rss_before_mib": before / 1024,
        "aggregated": len(state.survivors),
        "traffic_mib": traffic,
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }


def _flower_subprocess(n: int, timeout: float) -> dict[str, object] | None:
    """Run :func:`flower_round` in a fresh process (a clean peak RSS); None on timeout."""
    code = (
        "import json, sys; from benchmarks.sesa_bench import flower_round; "
        f"print('RESULT ' + json.dumps(flower_round({n})))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True, text=True, timeout=timeout, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            out: dict[str, object] = json.loads(line[len("RESULT ") :])
            return out
    print(done.stdout[-2000:], done.stderr[-4000:])
    return None


def flower_table(sizes: list[int], timeout: float) -> list[dict[str, object]]:
    """Print one secure round through Flower per ``N``: time, peak RSS, relayed bytes."""
    print(
        "\none secure round through Flower (SesaFedAvg + sesa_mod on InProcessGrid, every "
        "message protobuf-encoded), MLP 784-200-10, S = 4, T = N/2, no dropouts; a fresh process "
        f"per N, {timeout:.0f} s limit"
    )
    print(
        f"{'N':>4} {'T':>3} {'seconds':>8} {'CPU s':>7} {'peak RSS MiB':>12} "
        f"{'offline up MiB':>14} {'train down MiB':>14} {'decode down MiB':>15} {'load avg':>15}"
    )
    rows: list[dict[str, object]] = []
    for n in sizes:
        row = _flower_subprocess(n, timeout)
        if row is None:
            print(f"{n:>4} did not finish in {timeout:.0f} s", flush=True)
            break
        traffic: dict[str, list[float]] = row["traffic_mib"]  # type: ignore[assignment]
        load = " ".join(row["loadavg"])  # type: ignore[arg-type]
        print(
            f"{n:>4} {row['T']:>3} {row['seconds']:>8.1f} {row['cpu_s']:>7.1f} "
            f"{row['peak_rss_mib']:>12.0f} "
            f"{traffic['offline'][1]:>14.0f} {traffic['train'][0]:>14.0f} "
            f"{traffic['decode'][0]:>15.0f} {load:>15}",
            flush=True,
        )
        rows.append(row)
    if len(rows) >= 2:
        a, b = rows[-2], rows[-1]
        ratio = float(b["n"]) / float(a["n"])  # type: ignore[arg-type]
        exp_t = math.log(float(b["seconds"]) / float(a["seconds"])) / math.log(ratio)  # type: ignore[arg-type]
        exp_m = math.log(
            (float(b["peak_rss_mib"]) - 130) / (float(a["peak_rss_mib"]) - 130)  # type: ignore[arg-type]
        ) / math.log(ratio)
        print(f"scaling N = {a['n']} -> {b['n']}: time ~ N^{exp_t:.2f}, peak RSS ~ N^{exp_m:.2f}")
    if rows:
        last = rows[-1]
        verdict = "PASS" if last["n"] == 100 and float(last["seconds"]) <= 600 else "FAIL"  # type: ignore[arg-type]
        print(
            f"largest N reached: {last['n']} in {float(last['seconds']):.0f} s, "  # type: ignore[arg-type]
            f"peak RSS {float(last['peak_rss_mib']) / 1024:.2f} GiB; "  # type: ignore[arg-type]
            f"target one secure round at N = 100 within 10 min (wall, this machine's load): "
            f"{verdict}; its CPU time {float(last['cpu_s']):.0f} s"  # type: ignore[arg-type]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 50, 100])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--relay-mib", type=float, default=400.0)
    parser.add_argument(
        "--flower", type=int, nargs="*", default=[20, 100],
        help="N of the secure rounds through Flower (none: skip)",
    )  # fmt: skip
    parser.add_argument("--flower-timeout", type=float, default=900.0)
    parser.add_argument(
        "--protocol-rounds", action="store_true",
        help="also the Flower-free whole rounds at a reduced shard length (10%% lost)",
    )  # fmt: skip
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "sesa_bench.json"
    )
    args = parser.parse_args()
    users, rounds = [], []
    per_user(8, 1, 1)  # compile and load the numba kernels outside the measurements
    print(
        f"MLP 784-200-10, K = {K} shards of d = {SHARD_WORDS} words (+ output bias group of "
        f"{BIAS_WORDS}), T = N/2, p = 2^32 - 5; per user at full size, median of "
        f"{args.repeats}; load avg {' '.join(open('/proc/loadavg').read().split()[:3])}"
    )
    print(
        "offline: Theorem 2 bounds it by N K_i d log²(K+T) log log(K+T) (no constant); this "
        "implementation does the direct (N-1)(T+1) K_i d multiply-adds (one fused kernel), which "
        "is fewer at these sizes: ops/Thm2 = their ratio; t/Thm2 = offline time over the bound's "
        "operations priced at the kernel's measured time per multiply-add"
    )
    print(
        f"{'N':>4} {'K_i':>3} {'offline s':>9} {'mask s':>7} {'psi s':>6} {'off up MiB':>10} "
        f"{'on up MiB':>9} {'on down MiB':>11} {'off/Thm1':>8} {'on/Thm1':>7} "
        f"{'ops/Thm2':>8} {'t/Thm2':>6} {'psi ns/Nd':>9}"
    )
    for n in args.clients:
        for slots in (4, 2, 1):
            row = per_user(n, slots, args.repeats)
            users.append(row)
            print(
                f"{n:>4} {slots:>3} {row['offline_s']:>9.3f} {row['online_mask_s']:>7.3f} "
                f"{row['online_eval_s']:>6.3f} {row['offline_up_mib']:>10.2f} "
                f"{row['online_up_mib']:>9.3f} {row['online_down_mib']:>11.2f} "
                f"{row['offline_vs_thm1']:>8.3f} {row['online_vs_thm1']:>7.3f} "
                f"{row['ops_vs_thm2']:>8.3f} {row['offline_vs_thm2']:>6.2f} "
                f"{row['online_eval_ns_per_Nd']:>9.2f}",
                flush=True,
            )
    if args.protocol_rounds:
        print("\nwhole rounds (10% lost: half after offline, half after the masked update)")
        print(f"{'N':>4} {'d':>6} {'aggregated':>10} {'evals':>5} {'exact':>5} {'server s':>8}")
        for n in args.clients:
            row = whole_round(n, args.relay_mib, seed=n)
            rounds.append(row)
            print(
                f"{n:>4} {row['shard_words']:>6} {row['aggregated']:>10} "
                f"{row['evaluations']:>5} {row['exact']!s:>5} {row['server_s']:>8.2f}",
                flush=True,
            )
    flower = flower_table(args.flower, args.flower_timeout) if args.flower else []
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"per_user": users, "rounds": rounds, "flower": flower}, indent=2)
    )
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
