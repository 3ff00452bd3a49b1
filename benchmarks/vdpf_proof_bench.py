"""Leaf-proof pass benchmark: full-domain evaluation with and without proofs, per point.

Run ``python benchmarks/vdpf_proof_bench.py [--baseline-tree PATH] [--rounds N]``. One core
(the process pins itself to the CPU it starts on where the OS allows it); times are process
CPU time, best of ``--repeat``.

The case is one segment of the SSA server's key check (:class:`flwr_fsl.families.ssa.verify.
KeyCheck`: consecutive keys worth ``2**16`` points, ``tau = 2``, verifiable keys, each key's
evaluated points cut to ``--length`` of its ``2**--depth`` leaves), evaluated by
:func:`flwr_fsl.crypto.dpf.evaluate_batch` without and with ``proofs``. Printed per point:

* ``plain`` and ``proofs``: the two evaluations;
* ``extra``: their difference, the leaf-proof pass's cost;
* ``aes``: the proof hash's AES alone (4 blocks a point, replayed in the pass's batch sizes
  from one hot buffer through the native entry point: its floor);
* ``non-AES``: ``extra - aes``, what the pass adds around OpenSSL;
* ``proofs+GMAC``: the checked evaluation followed by the digest's GMAC over its proofs (the
  key check's next read of them: a pass that writes its proofs past the caches pays there).

The ``GMAC`` line (:func:`gmac_rates`) times the digest's GMAC alone over a segment's proofs
(64 bytes a point): the same buffer again (in cache), in :data:`PIECE` pieces fed to one
streamed context (what hashing each batch right after the pass wrote it would cost), and a
fresh buffer each time (:data:`COLD_SEGMENTS` of them, past the L3 cache: from memory, where the
pass's non-temporal stores leave the proofs). Issue 26 asked whether hashing the proofs while
they are in cache would pay: on the 2-core AMD EPYC (Zen 3, VAES and VPCLMULQDQ, no AVX-512)
of session 36, OpenSSL's GHASH read 4.3-4.6 GB/s from cache and 4.7 GB/s from memory at load
0.1 (bound by its own arithmetic, not the memory), and memory / cache was 1.0-1.24x at load 5
(other processes' memory traffic): at most a few percent of a client's time, not enough to
pay for a second, in-order proof pass (the chunks' tasks go by height, not by point).

With ``--baseline-tree`` the same evaluations also run on that checkout's code (a
subprocess), alternating with this tree's ``--rounds`` times; the best of each is printed
with the load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpf_bench import best_of

from flwr_fsl.crypto import dpf

U64 = np.uint64
BLOCKS = 4  # AES blocks of one leaf proof
BATCH = 2048  # leaves per proof batch (the pass's, for the AES replay)
PROOF_BYTES = 64  # bytes of one leaf proof
PIECE = 1 << 17
"""Bytes per streamed GMAC piece of :func:`gmac_rates` (2048 proofs: one proof batch)."""
COLD_SEGMENTS = 64
"""Distinct segment buffers :func:`gmac_rates` hashes from memory (256 MiB at ``2**16`` points)."""


def case(args: argparse.Namespace) -> tuple[dict[str, Callable[[], Any]], int]:
    """Return the segment's evaluations (plain, checked, checked then digested) and its points."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    n = (1 << 16) // args.length
    rng = np.random.default_rng(7)
    alphas = rng.integers(0, args.length, n).astype(U64)
    betas = rng.integers(0, 2**62, (n, 2)).astype(U64)
    k0, _ = dpf.generate_keys_batch(alphas, betas, np.full(n, args.depth), verifiable=True)
    lengths = np.full(n, args.length, np.int64)
    points = n * args.length
    out = np.empty((points, 2), U64)
    proofs = np.empty((points, 8), U64)
    gmac = AESGCM(bytes(16))

    def plain() -> None:
        dpf.evaluate_batch(k0, lengths=lengths, out=out)

    def checked() -> None:
        dpf.evaluate_batch(k0, lengths=lengths, out=out, proofs=proofs)

    def digested() -> None:  # the key check's next step: GMAC over the proofs (digest v3)
        checked()
        gmac.encrypt(bytes(12), b"", proofs.data.cast("B"))

    return {"plain": plain, "proofs": checked, "digest": digested}, points


def eval_only(args: argparse.Namespace) -> dict[str, float]:
    """Per-point seconds of the segment's evaluations on the imported code."""
    fns, points = case(args)
    for fn in fns.values():
        fn()
    return {name: best_of(fn, args.repeat) / points for name, fn in fns.items()}


def aes_floor(points: int, repeat: int) -> float:
    """Per-point seconds of the proof hash's AES alone (native, the pass's batch sizes)."""
    from flwr_fsl.crypto.prg import MMO_KEY_PROOF
    from flwr_fsl.kernels.aes import native_aes, native_replay

    cipher = native_aes(MMO_KEY_PROOF)
    if cipher is None:
        return float("nan")
    src = np.random.default_rng(1).integers(0, 2**63, (BLOCKS * BATCH + 1, 2)).astype(U64)
    dst = np.empty_like(src)
    sizes = [BLOCKS * BATCH] * (points // BATCH) + [BLOCKS * (points % BATCH)] * bool(
        points % BATCH
    )
    arr = np.array(sizes, np.int64)

    def replay() -> None:
        if not native_replay(cipher.fn, cipher.ctx, src, dst, arr):
            raise RuntimeError("OpenSSL AES failed")

    replay()
    return best_of(replay, repeat) / points


def gmac_rates(points: int, repeat: int) -> dict[str, float]:
    """Per-point seconds of GMAC over ``points`` proofs: in cache, in pieces, from memory.

    Returns ``{"hot": ..., "pieces": ..., "cold": ...}``: one ``AESGCM.encrypt`` over the same
    buffer again, a streamed ``Cipher(AES, GCM)`` fed :data:`PIECE` bytes at a time over it
    (the same tag), and one ``AESGCM.encrypt`` per buffer over :data:`COLD_SEGMENTS` distinct
    buffers (each read once per pass).
    """
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key, nonce = bytes(range(16)), bytes(12)
    size = points * PROOF_BYTES
    bufs = np.random.default_rng(2).integers(0, 255, (COLD_SEGMENTS, size), np.uint8)
    hot = bufs[0].data.cast("B")
    mac = AESGCM(key)
    tag = mac.encrypt(nonce, b"", hot)

    def in_cache() -> None:
        mac.encrypt(nonce, b"", hot)

    def pieces() -> None:
        enc = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
        for at in range(0, size, PIECE):
            enc.authenticate_additional_data(hot[at : at + PIECE])
        enc.finalize()
        if enc.tag != tag[-16:]:
            raise AssertionError("streamed GMAC differs from AESGCM.encrypt")

    def from_memory() -> None:
        for row in bufs:
            mac.encrypt(nonce, b"", row.data.cast("B"))

    pieces()
    return {
        "hot": best_of(in_cache, repeat) / points,
        "pieces": best_of(pieces, repeat) / points,
        "cold": best_of(from_memory, max(1, repeat // 2)) / (COLD_SEGMENTS * points),
    }


def run_tree(tree: str | None, args: argparse.Namespace) -> dict[str, float]:
    """:func:`eval_only` in a subprocess on the code in ``tree`` (this tree when None)."""
    out = Path(tempfile.mkdtemp()) / "times.json"
    cmd = [sys.executable, __file__, "--eval-only", str(out)]
    cmd += ["--depth", str(args.depth), "--length", str(args.length)]
    cmd += ["--repeat", str(args.repeat)]
    root = Path(tree) if tree else Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root.resolve()))
    subprocess.run(cmd, env=env, check=True)
    res: dict[str, float] = json.loads(out.read_text())
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=5, help="key depth (2**depth leaves)")
    parser.add_argument("--length", type=int, default=24, help="evaluated points per key")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="alternations with the baseline")
    parser.add_argument("--baseline-tree", help="also time the evaluations on this checkout")
    parser.add_argument("--eval-only", help=argparse.SUPPRESS)  # the per-tree subprocess
    args = parser.parse_args()
    if args.length > 1 << args.depth:
        parser.error("--length exceeds 2**depth")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if args.eval_only:
        Path(args.eval_only).write_text(json.dumps(eval_only(args)))
        return
    trees: dict[str, str | None] = {"this tree": None}
    if args.baseline_tree:
        trees["baseline"] = args.baseline_tree
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, tree in reversed(trees.items()):  # baseline first, then this tree
            res = run_tree(tree, args)
            prev = best.setdefault(name, res)
            for k, v in res.items():
                prev[k] = min(prev[k], v)
    points = ((1 << 16) // args.length) * args.length
    aes = aes_floor(points, args.repeat)
    print(f"segment: {points} points, depth {args.depth}, {args.length} points/key, tau 2")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"proof AES alone (4 blocks/point, native): {aes * 1e9:6.1f} ns/point")
    for name, r in best.items():
        extra = r["proofs"] - r["plain"]
        print(
            f"{name:>10}: plain {r['plain'] * 1e9:6.1f}  proofs {r['proofs'] * 1e9:6.1f}  "
            f"extra {extra * 1e9:6.1f}  non-AES {(extra - aes) * 1e9:6.1f}  "
            f"proofs+GMAC {r['digest'] * 1e9:6.1f} ns/point"
        )
    rates = gmac_rates(points, args.repeat)
    gbps = {k: PROOF_BYTES / v / 1e9 for k, v in rates.items()}
    print(
        f"GMAC of the segment's proofs: in cache {rates['hot'] * 1e9:5.1f} ns/point "
        f"({gbps['hot']:.2f} GB/s), in {PIECE >> 10} KiB pieces {rates['pieces'] * 1e9:5.1f} "
        f"({gbps['pieces']:.2f} GB/s), from memory {rates['cold'] * 1e9:5.1f} "
        f"({gbps['cold']:.2f} GB/s); memory / cache {rates['cold'] / rates['hot']:.2f}x"
    )
    if "baseline" in best:
        this, base = best["this tree"], best["baseline"]
        ratio = (base["proofs"] - base["plain"] - aes) / (this["proofs"] - this["plain"] - aes)
        print(f"non-AES speed-up vs baseline: {ratio:.2f}x")


if __name__ == "__main__":
    main()
