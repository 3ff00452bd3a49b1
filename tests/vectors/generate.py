"""Known-answer vectors that freeze today's wire formats: DPF keys, SSA parameters, sparse codec.

``python -m tests.vectors.generate`` writes ``tests/vectors/frozen.json`` from the code as it is;
it refuses to overwrite the file unless ``--force`` is given. ``tests/test_frozen_vectors.py``
recomputes every entry and compares byte for byte.

A changed vector means a format (or an algorithm behind a format) changed: keys made by the old
code would no longer interoperate. Do that only on purpose, with a version bump in the format
and a line in the closing note saying why, then regenerate with ``--force``.

Everything here is deterministic: DPF keys come from explicit root or master seeds, SSA uploads
from explicit master seeds and a seeded rounding generator, hashing from a fixed key and a
seeded cuckoo insertion order. The helper wire format (versioned separately, bumped on purpose
when rounds were bound to sessions) and HPKE sealed boxes (randomized) are not frozen here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fsl.crypto import dpf, prg
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.hashing import HashParams, cuckoo_hash, simple_hash
from flwr_fsl.families.ssa.protocol import SSAParams, SSAServer, encode_update
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate

PATH = Path(__file__).with_name("frozen.json")


def _seed(tag: int) -> bytes:
    digest = bytearray(hashlib.sha256(f"flwr_fsl frozen vector {tag}".encode()).digest()[:16])
    digest[0] &= 0xFE  # a DPF root seed keeps bit 0 clear (it carries the control bit)
    return bytes(digest)


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _words(array: Any) -> str:
    return _h(np.ascontiguousarray(np.asarray(array, dtype="<u8")).tobytes())


def dpf_vectors() -> dict[str, Any]:
    """Single keys (scalar, odd and even tau, depth 0/1) and one batch with its U-DPF hint."""
    out: dict[str, Any] = {}
    cases = [
        ("scalar-d5", 13, 7, 5),
        ("scalar-d0", 0, 2**64 - 1, 0),
        ("scalar-d1", 1, 42, 1),
        (
            "tau3-d9",
            300,
            np.array([1, 2**63, 5], np.uint64),
            9,
        ),  # odd tau: early termination, two points per leaf
        ("tau2-d6", 17, np.array([2**64 - 1, 9], np.uint64), 6),
    ]
    for i, (name, alpha, beta, bits) in enumerate(cases):
        k0, k1 = dpf.generate_keys(alpha, beta, bits, root_seeds=(_seed(2 * i), _seed(2 * i + 1)))
        points = np.array(sorted({0, alpha, (2**bits) - 1}), dtype=np.uint64)
        out[name] = {
            "key0": k0.to_bytes().hex(),
            "key1": k1.to_bytes().hex(),
            "eval0": _words(dpf.evaluate(k0)),
            "eval1": _words(dpf.evaluate(k1)),
            "at0": [int(v) for v in np.asarray(dpf.evaluate_at(k0, points)).reshape(-1)],
        }
    alphas = np.array([3, 0, 100, 7], dtype=np.uint64)
    betas = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], dtype=np.uint64)
    bits = np.array([4, 1, 8, 3])
    b0, b1 = dpf.generate_keys_batch(alphas, betas, bits, master_seeds=(_seed(20), _seed(21)))
    hint = dpf.next_hint_batch(b0, b1, betas + np.uint64(10), 1, alphas=alphas)
    moved = dpf.update_batch(b0, hint, 1)
    out["batch"] = {
        "key0": b0.to_bytes().hex(),
        "key1": b1.to_bytes().hex(),
        "eval0": _words(dpf.evaluate_batch(b0)[0]),
        "hint": hint.to_bytes().hex(),
        "updated0": _h(moved.to_bytes()),
    }
    return out


def prg_vectors() -> dict[str, Any]:
    """Root-seed derivation (the PRF) and the AES-CTR stream."""
    return {
        "derive_root_seeds": _words(prg.derive_root_seeds(_seed(30), 5)),
        "ctr_stream": _words(prg.ctr_stream(_seed(31), _seed(32), 9)),
    }


def hashing_vectors() -> dict[str, Any]:
    """Cuckoo and simple tables of a fixed set under a fixed key."""
    params = HashParams(domain_size=1000, num_bins=40, key=_seed(40), num_hashes=3)
    items = np.array([1, 5, 17, 99, 256, 511, 512, 998], dtype=np.int64)
    cuckoo = cuckoo_hash(items, params, seed=7)
    simple = simple_hash(params)
    return {
        "cuckoo_items": [int(v) for v in cuckoo.items],
        "cuckoo_hash_ids": [int(v) for v in cuckoo.hash_ids],
        "simple": _words(simple.bin_items) + ":" + _words(simple.bin_offsets),
    }


def ssa_vectors() -> dict[str, Any]:
    """SSAParams encodings, one client's upload and both servers' shares."""
    out: dict[str, Any] = {}
    param_sets = {
        "topk": SSAParams(1, 1000, 30, 1, _seed(50)),
        "rows": SSAParams(7, 64, 5, 4, _seed(51), stash_size=2, frac_bits=16, epoch=7),
        "plain": SSAParams(3, 2**20, 100, 1, _seed(52), count_weighted=False, scale_factor=1.5),
    }
    for name, params in param_sets.items():
        out[f"params-{name}"] = params.to_bytes().hex()
    params = param_sets["rows"]
    indices = np.array([2, 9, 33, 60], dtype=np.int64)
    values = np.arange(16, dtype=np.float64).reshape(4, 4) / 8 - 1
    upload, _ = encode_update(
        params,
        indices,
        values,
        np.array([1.0, 2.0, 3.0, 0.5]),
        rng=np.random.default_rng(5),
        master_seeds=(_seed(53), _seed(54)),
    )
    out["upload-public"] = _h(upload.public_part)
    shares = []
    for party in (0, 1):
        server = SSAServer(params, party)
        server.add_client(11, upload.public_part, upload.master_seeds[party])
        shares.append(_words(server.share()))
    out["shares"] = shares
    return out


def fixedpoint_vectors() -> dict[str, Any]:
    """Exact and stochastic encodings."""
    fp = FixedPoint(frac_bits=24, max_abs=1e4, max_summands=1000)
    values = np.array([0.0, 1.0, -1.0, 0.5, -3.25, 9999.0])
    return {
        "exact": [int(v) for v in fp.encode_exact(values)],
        "stochastic": [int(v) for v in fp.encode(values / 3, rng=np.random.default_rng(9))],
    }


def codec_vectors() -> dict[str, Any]:
    """The sparse codec's records (dense, coordinates, rows, counts), serialized canonically."""
    from flwr_fsl.core.records import encode_update as encode_submodel

    rng = np.random.default_rng(3)
    update = SubmodelUpdate(
        tensors={
            "dense": TensorUpdate(Encoding.DENSE, rng.normal(size=(2, 3)).astype(np.float32)),
            "coords": TensorUpdate(
                Encoding.COORDINATES,
                np.array([0.5, -1.5], np.float32),
                np.array([4, 1], np.int64),
            ),
            "rows": TensorUpdate(
                Encoding.ROWS,
                np.ones((2, 3), np.float32),
                np.array([0, 5], np.int64),
                np.array([2.0, 7.0]),
            ),
        },
        weight=12.0,
    )
    content = encode_submodel(update)
    canonical: dict[str, Any] = {}
    for name, record in sorted(content.config_records.items()):
        canonical[f"config:{name}"] = sorted((k, repr(v)) for k, v in record.items())
    for name, arrays in sorted(content.array_records.items()):
        for key, array in sorted(arrays.items()):
            canonical[f"array:{name}:{key}"] = [
                array.dtype,
                list(array.shape),
                _h(array.data),
            ]
    return canonical


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "dpf": dpf_vectors,
    "prg": prg_vectors,
    "hashing": hashing_vectors,
    "ssa": ssa_vectors,
    "fixedpoint": fixedpoint_vectors,
    "codec": codec_vectors,
}


def compute() -> dict[str, Any]:
    """Compute every section's vectors from the current code (JSON-normalized)."""
    data = {name: fn() for name, fn in SECTIONS.items()}
    return json.loads(json.dumps(data))


def main(argv: list[str] | None = None) -> int:
    """Write the vectors file (``--force`` to overwrite)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="overwrite frozen.json")
    args = parser.parse_args(argv)
    if PATH.exists() and not args.force:
        print(
            f"{PATH} exists: a changed format needs a version bump; pass --force", file=sys.stderr
        )
        return 1
    PATH.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
