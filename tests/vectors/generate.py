"""Known-answer vectors that freeze today's wire formats, one section per format family.

``python -m tests.vectors.generate`` writes ``tests/vectors/frozen.json`` from the code as it is;
it refuses to overwrite the file unless ``--force`` is given. ``tests/test_frozen_vectors.py``
recomputes every entry and compares byte for byte.

A changed vector means a format (or an algorithm behind a format) changed: keys made by the old
code would no longer interoperate. Do that only on purpose, with a version bump in the format
and a line in the closing note saying why, then regenerate with ``--force``.

Everything here is deterministic: DPF and DCF keys come from explicit root or master seeds, SSA
uploads and client states from explicit master seeds and a seeded rounding generator, hashing
from a fixed key and a seeded cuckoo insertion order, X25519 keys from fixed 32-byte seeds.
Messages that carry randomness (SecAgg and SESA shares, sealed blobs inside a message) are
frozen as the encoding of a message object built from fixed field values: the same object must
give the same bytes. Sections: DPF keys, PRG, hashing, SSA params and uploads, fixed point,
the sparse codec; SecAgg (``FSAG``, ``FSAC``, ids, roster, shares, unmask, rows, masked
inputs, the weighted vector); SESA (``FSEP``/``FSER``/``FSEU``/``FSEB``/``FSEI``/``FSEX`` v2/
``FSED``/``FSEE``/``FSEC``/``FSEM``, the node state ``FSEN``); width assignments (``FSLW``); PrivHFL
(``PHFL`` messages, ``PHAR`` architectures, ``PHAS`` answerer states, ``PHFW`` secure
answering); DCF keys (``FDCF`` v2); the helper wire format (``FSHW``, every built-in kind); the
sealed box's fixed parts and associated data (``FSSB``, ``FSAD``); the randomized-response memo
(``FSRR``); PSU and Niu vectors and SFSL memo scopes; SSA (``FSCS``) and PSR (``FSPQ``) client
states; SSA parameter version 6 (``range_check``: parameters, a checked upload with its
range trailer, shares, client state, the range check's material and check blobs) and Cui's
PSU over the two SSA servers (``FSPU`` parameters, binding, S1's seed share, totals, union,
the helper's ``PSU_SUM``/``PSU_TOTAL``); SSA parameter version 8 (the projected check's digest
version 2: parameters, the digest, a checked upload and its shares).

Sealed boxes (HPKE, randomized: fresh ephemeral key and nonce) cannot be regenerated. They are
sealed once to recipient keys drawn from fixed seeds and stored under :data:`SEALED_KEY`
(``--force`` keeps the stored ones; delete that key to seal new ones); the ``sealed-openings``
section checks that today's code opens them to the same plaintexts (``FSPA`` answers, PSR
queries, SSA uploads, U-DPF hints, :func:`~flwr_fsl.crypto.sealing.seal_for`) and that
their header and overhead are as stored. Issue 21 signed the SSA upload and the U-DPF hint
(``FSSG`` v1 inside the sealed plaintext): the stored unsigned ``ssa-upload`` / ``udpf-hint``
boxes still open at the channel level and are now *refused* by their ``open_*`` (their
``opened`` says so), and ``ssa-upload-v2`` / ``udpf-hint-v2`` (signed with a fixed Ed25519
key; missing names are sealed once and added, stored ones are kept) open to seed or held
digest plus the signer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.crypto import dpf, prg
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.hashing import HashParams, cuckoo_hash, simple_hash
from flwr_fsl.families.ssa import projected_check as pc
from flwr_fsl.families.ssa.dp import DistributedDP, RunScope
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
    # Format version 3 (issue 21): verifiable keys with proof correction words, their leaf
    # proofs (equal at both parties) and a U-DPF update that keeps them.
    v0, v1 = dpf.generate_keys_batch(
        alphas, betas, bits, master_seeds=(_seed(22), _seed(23)), verifiable=True
    )
    proofs = np.empty((int(v0.public.num_points.sum()), dpf.PROOF_WORDS), np.uint64)
    vhint = dpf.next_hint_batch(v0, v1, betas + np.uint64(10), 1, alphas=alphas)
    out["verifiable-batch"] = {
        "key0": v0.to_bytes().hex(),
        "key1": v1.to_bytes().hex(),
        "eval0": _words(dpf.evaluate_batch(v0, proofs=proofs)[0]),
        "proofs": _words(proofs),
        "hint": vhint.to_bytes().hex(),
        "updated0": _h(dpf.update_batch(v0, vhint, 1).to_bytes()),
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


_DP = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, max_weight=1.0)
_RUN = RunScope("42", PrivacyBudget(20.0))


def ssa_vectors() -> dict[str, Any]:
    """SSAParams encodings, one client's upload and both servers' shares."""
    out: dict[str, Any] = {}
    # Versions 1 to 4: the unchecked rounds (verify=False), byte for byte as before issue 21.
    unchecked = {
        "topk": SSAParams(1, 1000, 30, 1, _seed(50)),
        "rows": SSAParams(7, 64, 5, 4, _seed(51), stash_size=2, frac_bits=16, epoch=7),
        "plain": SSAParams(3, 2**20, 100, 1, _seed(52), count_weighted=False, scale_factor=1.5),
        # Version 4 (issue 20): unit weights, without and with DP, and with DP naming its run.
        "unit": SSAParams(1, 1000, 30, 1, _seed(50), weighted=False),
        "unit-dp": SSAParams(
            2, 1000, 30, 1, _seed(50), weighted=False, dp=DistributedDP(1.5, 2.0, 1.0, 1e-6)
        ),
        "unit-dp-run": SSAParams(
            7, 64, 5, 4, _seed(51), frac_bits=16, dp=_DP, run=_RUN, weighted=False
        ),
        # Version 2 (a "dp" object) and version 3 ("dp" and the run's "run" object).
        "rows-dp": SSAParams(7, 64, 5, 4, _seed(51), frac_bits=16, dp=_DP),
        "rows-dp-run": SSAParams(7, 64, 5, 4, _seed(51), frac_bits=16, dp=_DP, run=_RUN),
    }
    # Pinned to the projected check's digest version 1, the default when they were frozen (a
    # checked round's default is version 2 since session 31: ssa_default_round_vectors).
    unchecked = {name: replace(p, projected_digest=1) for name, p in unchecked.items()}
    param_sets = {name: replace(p, verify=False) for name, p in unchecked.items()}
    # Version 5 (issue 21): the servers check every client's keys, value words unchecked.
    param_sets.update(
        {
            f"checked-{name}": replace(unchecked[name], value_check="off")
            for name in ("topk", "unit", "unit-dp-run")
        }
    )
    # Version 6: the exact value check; version 7: the projected value check (the default).
    param_sets["exact-unit"] = replace(unchecked["unit"], value_check="exact")
    param_sets.update(
        {f"projected-{name}": unchecked[name] for name in ("topk", "unit", "unit-dp-run")}
    )
    param_sets["projected-r16"] = replace(unchecked["unit"], projections=16)
    for name, params in param_sets.items():
        out[f"params-{name}"] = params.to_bytes().hex()
    rows = param_sets["rows"]
    for suffix, params in (
        ("", rows),
        ("-unit", replace(rows, weighted=False)),
        ("-checked-unit", replace(rows, weighted=False, verify=True, value_check="off")),
        ("-projected-unit", replace(rows, weighted=False, verify=True, value_check="projected")),
    ):
        indices = np.array([2, 9, 33, 60], dtype=np.int64)
        values = np.arange(16, dtype=np.float64).reshape(4, 4) / 8 - 1
        upload, _ = encode_update(
            params,
            indices,
            values,
            np.array([1.0, 2.0, 3.0, 0.5]),  # the count words of a weighted round
            rng=np.random.default_rng(5),
            master_seeds=(_seed(53), _seed(54)),
        )
        out[f"upload-public{suffix}"] = _h(upload.public_part)
        shares = []
        for party in (0, 1):
            server = SSAServer(params, party)
            server.add_client(11, upload.public_part, upload.master_seeds[party])
            shares.append(_words(server.share()))
        out[f"shares{suffix}"] = shares
    return out


def _rows_upload(params: SSAParams) -> tuple[Any, Any]:
    """One client's upload and state of the ``rows`` round shape (four rows of four words)."""
    return encode_update(
        params,
        np.array([2, 9, 33, 60], dtype=np.int64),
        np.arange(16, dtype=np.float64).reshape(4, 4) / 8 - 1,
        rng=np.random.default_rng(5),
        master_seeds=(_seed(53), _seed(54)),
    )


def _server_shares(params: SSAParams, upload: Any) -> list[str]:
    """Both servers' shares (as word digests) after adding one client's upload as client 11."""
    shares = []
    for party in (0, 1):
        server = SSAServer(params, party)
        server.add_client(11, upload.public_part, upload.master_seeds[party])
        shares.append(_words(server.share()))
    return shares


def ssa_projected_digest2_vectors() -> dict[str, Any]:
    """SSA parameter version 8 (the projected check's digest version 2): params, upload, shares.

    Also an unchecked round carrying its checked variant's non-default ``projections`` and
    ``projected_digest`` (versions 1 to 4 write them only then).
    """
    rows = SSAParams(7, 64, 5, 4, _seed(51), stash_size=2, frac_bits=16, weighted=False)
    params = replace(rows, projected_digest=2)
    out: dict[str, Any] = {
        "params-projected-digest2": params.to_bytes().hex(),
        "params-unchecked-variant": replace(params, verify=False, projections=16).to_bytes().hex(),
    }
    upload, state = _rows_upload(params)
    out["public-digest-v2"] = pc.public_digest_v2(state.keys[0].public).hex()
    out["upload-public"] = _h(upload.public_part)
    out["shares"] = _server_shares(params, upload)
    return out


def ssa_default_round_vectors() -> dict[str, Any]:
    """The default checked round (digest version 2, parameter version 8): params, upload, shares.

    The shapes of :func:`ssa_vectors`' ``projected-*`` sets and its ``rows`` upload, with the
    defaults of this version (``projected_digest`` unset).
    """
    sets = {
        "topk": SSAParams(1, 1000, 30, 1, _seed(50)),
        "unit": SSAParams(1, 1000, 30, 1, _seed(50), weighted=False),
        "unit-dp-run": SSAParams(
            7, 64, 5, 4, _seed(51), frac_bits=16, dp=_DP, run=_RUN, weighted=False
        ),
    }
    out: dict[str, Any] = {f"params-{name}": p.to_bytes().hex() for name, p in sets.items()}
    rows = SSAParams(7, 64, 5, 4, _seed(51), stash_size=2, frac_bits=16, epoch=7, weighted=False)
    upload, state = _rows_upload(rows)
    out["public-digest-v2"] = pc.public_digest_v2(state.keys[0].public).hex()
    out["upload-public"] = _h(upload.public_part)
    out["shares"] = _server_shares(rows, upload)
    return out


def ssa_key_check_vectors() -> dict[str, Any]:
    """Both servers' key-check digests of one checked upload: version 2 and version 3 (keyed)."""
    # value_check="off": the section is the key check's digest alone (the projected check's
    # blob has its own section).
    params = replace(
        SSAParams(7, 64, 5, 4, _seed(51), stash_size=2, frac_bits=16, value_check="off"),
        weighted=False,
    )
    upload, _ = _rows_upload(params)
    out: dict[str, Any] = {}
    for name, key in (("v2", None), ("v3", _seed(55))):
        digests = []
        for party in (0, 1):
            server = SSAServer(params, party, digest_key=key)
            digest = server.add_client(11, upload.public_part, upload.master_seeds[party])
            digests.append(None if digest is None else digest.hex())
        out[f"digests-{name}"] = digests
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


# -- formats frozen before the module refactor (tags 100 and up) ------------------------------


def _key(tag: int) -> Any:
    """An X25519 key pair from a fixed 32-byte seed (X25519 clamps any 32 bytes)."""
    from flwr_fsl.crypto.channel import SealingKeyPair

    return SealingKeyPair.from_private_bytes(_seed(tag) + _seed(tag + 1000))


def _blob(tag: int, size: int) -> bytes:
    """``size`` fixed pseudo-random bytes standing for an opaque field (e.g. a sealed blob)."""
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"flwr_fsl frozen blob {tag} {counter}".encode()).digest()
        counter += 1
    return out[:size]


def secagg_vectors() -> dict[str, Any]:
    """SecAgg (Bonawitz): params, ids, roster, share entries, unmask request/reply, rows,
    client state, a deterministic masked input, and the weighted-vector encoding."""
    from flwr_fsl.crypto.channel import associated_data, client_party
    from flwr_fsl.families.secagg import messages as secagg_messages
    from flwr_fsl.families.secagg import protocol as secagg
    from flwr_fsl.families.secagg.vector import WeightedVector

    params = secagg.SecAggParams(9, _seed(100), 2, 6)
    sparse = secagg.SecAggParams(9, _seed(100), 2, 6, neighbours=2)
    keys = {node: (_key(110 + 2 * node), _key(111 + 2 * node)) for node in (3, 5, 8)}
    roster = {n: (c.public_bytes, s.public_bytes) for n, (c, s) in keys.items()}
    clients = {
        n: secagg.SecAggClient(n, params, c, s, _seed(120 + n)) for n, (c, s) in keys.items()
    }
    fresh = clients[3].to_bytes()
    for client in clients.values():
        client.roster = dict(roster)  # as after share_keys (whose shares are randomized)
        client.own_share = np.arange(secagg_messages._LIMBS, dtype=np.uint64) * np.uint64(
            1000 + client.node
        )
    x = np.arange(6, dtype=np.uint64) * np.uint64(2**40 + 7)
    masked = clients[3].masked_input([3, 5, 8], x)
    rows = np.array([0, 2, 5], np.int64)
    subset = secagg.SecAggClient(5, params, *keys[5], _seed(125), dict(roster))
    subset.own_share = np.zeros(secagg_messages._LIMBS, np.uint64)
    masked_rows = subset.masked_input(
        [3, 5, 8], x[:3], rows=rows, shared_rows={3: np.array([2], np.int64)}
    )
    blobs = {5: _blob(101, secagg.SEALED_SHARE_BYTES), 8: _blob(102, secagg.SEALED_SHARE_BYTES)}
    reply = secagg._unmask_reply_to_bytes(
        {
            5: bytes([0]) + np.arange(secagg._SEED_LIMBS, dtype="<u4").tobytes(),
            8: bytes([1]) + np.arange(secagg._SK_LIMBS, dtype="<u4").tobytes(),
        }
    )
    layout = WeightedVector(("w", "b"), ((2, 2), (3,)), ("acc",), 0.5, 10.0, 1.0, 16, 50)
    model = {"w": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float32)}
    trained = {
        "w": np.array([[0.1, -0.2], [0.7, 0.3]], np.float32),
        "b": np.full(3, 1.25, np.float32),
    }
    encoded, clipped = layout.encode(model, trained, 3.0, {"acc": 0.75}, np.random.default_rng(7))
    return {
        "params": params.to_bytes().hex(),
        "params-digest": params.digest.hex(),
        "ids": secagg.encode_ids([8, 3, 2**64 - 1, 0]).hex(),
        "advertise": clients[3].advertise().hex(),
        "roster": secagg._roster_to_bytes(roster).hex(),
        "share-entries": secagg._entries_to_bytes(blobs, secagg.SEALED_SHARE_BYTES).hex(),
        "unmask-request": secagg.UnmaskRequest((3, 5, 8), blobs).to_bytes().hex(),
        "unmask-reply": reply.hex(),
        "rows": secagg.encode_rows({8: rows, 3: np.array([1], np.int64), 5: rows[:0]}).hex(),
        "share-ad": associated_data(  # what seal_for binds a share from 3 to 8 to
            purpose=secagg.SHARE_PURPOSE,
            sender=client_party(3),
            recipient=client_party(8),
            **params.binding.fields(),
        ).hex(),
        "state-fresh": fresh.hex(),
        "state-masked": _h(clients[3].to_bytes()),
        "masked-input": _words(masked),
        "masked-input-rows": _words(masked_rows),
        "pair-mask": _words(secagg.pair_mask(params, keys[3][1].private_key, roster[8][1], 3, 8)),
        "weighted-vector": [int(v) for v in encoded] + [clipped],
        # SecAgg+ (issue 26): FSAG / FSAC version 2, only with neighbours.
        "params-v2": sparse.to_bytes().hex(),
        "state-fresh-v2": secagg.SecAggClient(3, sparse, *keys[3], _seed(123)).to_bytes().hex(),
    }


def sesa_vectors() -> dict[str, Any]:
    """SESA: params, ids, roster, piece, masked update, evaluation, request, client state,
    the offline bundle's frame (sealed pieces opened), the node state and the shard vector."""
    from flwr_fsl.crypto.channel import client_party
    from flwr_fsl.crypto.fixedpoint import FixedPoint
    from flwr_fsl.crypto.sealing import open_from
    from flwr_fsl.families.sesa import messages as sesa_messages
    from flwr_fsl.families.sesa import protocol as sesa
    from flwr_fsl.families.sesa.mod import SesaNodeState

    params = sesa.SesaParams(4, _seed(200), 1, (sesa.SesaGroup(3, 2), sesa.SesaGroup(1, 3)))
    keys = {n: _key(210 + n) for n in (1, 4, 6, 9)}
    roster = {n: k.public_bytes for n, k in keys.items()}
    client = sesa.SesaClient(4, params, ((0, 2), (0,)), keys[4], _seed(220))
    fresh = client.to_bytes()
    bundle = client.offline(sesa._roster_to_bytes(roster))
    r = sesa_messages._reader(bundle, sesa_messages._M_BUNDLE, "bundle")
    frame = [r.u32("groups"), r.u32("slots"), r.u32("slots"), r.count("peers", 12)]
    pieces = []
    for _ in range(frame[-1]):
        peer, blob = r.u64("peer"), r.raw("blob")
        plain = open_from(
            keys[peer],
            blob,
            purpose=sesa.PIECE_PURPOSE,
            binding=params.binding,
            sender=client_party(4),
            recipient=client_party(peer),
        )
        pieces.append([peer, len(blob), _h(plain)])
    r.done()
    updates = [
        np.arange(2 * 2, dtype=np.uint64).reshape(2, 2) + np.uint64(5),
        np.array([[7, 8, 9]], np.uint64),
    ]
    masked = client.masked_update([1, 4, 6, 9], updates, complaint=[6])
    node = SesaNodeState(client, 0.5, ("fc1", "fc2"), ((0, 2), (1,)))
    words = [np.array([1, 2, 3], np.uint64), np.array([4, 5, 6, 7], np.uint64)]
    phis = [np.array([11, 12], np.uint64), np.array([13], np.uint64)]
    piece_masks = [
        np.arange(4, dtype=np.uint64).reshape(2, 2) + np.uint64(20),
        np.array([[30, 31, 32]], np.uint64),
    ]
    request = sesa._Request((1, 4), {1: b"x1", 4: b"x4"}, {1: b"sealed-from-1"})
    shard = sesa.ShardVector(3, FixedPoint(8, 100.0, 10, ring=params.field))
    return {
        "params": params.to_bytes().hex(),
        "ids": sesa.encode_ids([9, 1, 4]).hex(),
        "roster": sesa._roster_to_bytes(roster).hex(),
        "piece": sesa._encode_piece(4, 9, phis, piece_masks).hex(),
        "masked": masked.hex(),
        "mailbox": sesa_messages.mailbox_to_bytes(
            {1: ((2, 1), b"sealed-from-1"), 9: ((1, 1), b"sealed-from-9")}
        ).hex(),
        "evaluation": sesa._evaluation_to_bytes([np.array([1, 2], np.uint64), words[0]]).hex(),
        "request": sesa._request_to_bytes(request).hex(),
        "state-fresh": fresh.hex(),
        "state-offline": _h(client.to_bytes()),
        "bundle-frame": bundle[:5].hex() + ":" + ",".join(str(v) for v in frame),
        "bundle-pieces": pieces,
        "node-state": _h(node.to_bytes()),
        "shard-vector": _words(
            shard.encode(np.array([[0.5, -1.0, 2.0]]), 2.0, np.random.default_rng(4))
        ),
    }


def width_vectors() -> dict[str, Any]:
    """The width assignment a client is told (``FSLW``)."""
    from flwr_fsl.families.width.messages import EXTRACTIONS, WidthAssignment

    layers = {"conv1": np.array([0, 3, 1], np.int64), "fc": np.array([7], np.int64)}
    out: dict[str, Any] = {
        e: WidthAssignment(3, 0.5, e, layers).to_bytes().hex() for e in EXTRACTIONS
    }
    out["empty"] = WidthAssignment(2**32 - 1, 0.0625, "rolling").to_bytes().hex()
    return out


def _architecture() -> Any:
    from flwr_fsl.families.privhfl.inference import (
        Architecture,
        AvgPool2d,
        Conv2d,
        Flatten,
        GlobalAvgPool,
        Linear,
        MaxPool2d,
        ReLU,
        Residual,
    )

    return Architecture(
        (1, 6, 6),
        (
            Conv2d(1, 2, 3, padding=1),
            ReLU(),
            Residual((Conv2d(2, 2, 3, padding=1, bias=False), ReLU()), ()),
            MaxPool2d(2),
            AvgPool2d(1, 1),
            Flatten(),
            Linear(18, 4),
            ReLU(),
            Linear(4, 3, bias=False),
        ),
    ), Architecture((2, 4, 4), (Conv2d(2, 3, 1), GlobalAvgPool(), Linear(3, 2)))


def privhfl_vectors() -> dict[str, Any]:
    """PrivHFL: one message per kind, the architecture codec, the answerer state, a querier's
    deals from fixed seeds, and the secure-answering messages of the mod (``PHFW``)."""
    from flwr_fsl.families.privhfl import flow as privhfl_flow
    from flwr_fsl.families.privhfl import messages as ps
    from flwr_fsl.families.privhfl import protocol as privhfl

    out: dict[str, Any] = {}
    for kind in sorted(privhfl.KIND_NAMES):
        arrays = tuple(
            np.arange(j + kind, dtype=np.uint64).reshape(-1) * np.uint64(2**33 + j)
            for j in range(kind % 3)
        )
        if kind % 2:
            arrays += (np.arange(6, dtype=np.uint64).reshape(2, 3),)
        blob = _blob(300 + kind, kind % 4)
        msg = privhfl.Message(kind, 1000 + kind, arrays, blob)
        out[f"message-{privhfl.KIND_NAMES[kind]}"] = msg.to_bytes().hex()
    deep, small = _architecture()
    out["architecture"] = privhfl_flow.architecture_to_bytes(deep).hex()
    out["architecture-gap"] = privhfl_flow.architecture_to_bytes(small).hex()
    state = privhfl_flow.AnswererState(
        2,
        3,
        4,
        17,
        _seed(310),
        _seed(311),
        [np.arange(6, dtype=np.uint64).reshape(3, 2), np.array([2**64 - 1], np.uint64)],
        (np.array([1, 2], np.uint64), np.array([[3]], np.uint64)),
    )
    out["answerer-state"] = state.to_bytes().hex()
    out["answerer-state-bare"] = (
        privhfl_flow.AnswererState(0, 1, 1, 0, _seed(312), _seed(313)).to_bytes().hex()
    )
    seeds = privhfl.SessionSeeds(_seed(320), _seed(321), _seed(322))
    config = privhfl.PrivHFLConfig(comparison="dcf", frac_bits=12, bound_bits=30)
    encoded = config.codec().encode_exact(np.linspace(-1, 1, 2 * 36).reshape(2, 1, 6, 6))
    deals, ops = privhfl_flow.querier_messages(config, deep, encoded.astype(np.uint64), seeds, 5)
    out["querier-deals"] = [_h(d) for d in deals] + [ops]
    out["unheld-seed"] = privhfl_flow.unheld_seed(_seed(323), _seed(324)).hex()
    cfg = privhfl.PrivHFLConfig(comparison="drelu", frac_bits=20, bound_bits=40)
    run = _seed(330)
    arch = privhfl_flow.architecture_to_bytes(small)
    messages: dict[str, Any] = {
        "keys-request": ps.KeysRequest(run),
        "keys-reply": ps.KeysReply(_key(331).public_bytes, arch),
        "generate-request": ps.GenerateRequest(
            cfg, 6, run, (ps.AnswererInfo(12, _key(333).public_bytes, arch, _seed(334)),)
        ),
        "generate-reply": ps.GenerateReply(
            2, (ps.SessionDeal(12, _blob(335, 72), (b"share", b"", b"deal-1")),)
        ),
        "step-request-1": ps.StepRequest(
            cfg, 1, 6, run, (ps.StepEntry(40, b"s-bytes", _blob(336, 72), _seed(337), 2),)
        ),
        "step-request-2": ps.StepRequest(
            config, 2, 6, run, (ps.StepEntry(40, b"s2"), ps.StepEntry(41, b""))
        ),
        "step-reply": ps.StepReply(((40, b"a-bytes"), (41, b""))),
        "sign-request": ps.SignRequest(cfg, 3, 6, ((12, b"z"),)),
        "sign-reply": ps.SignReply(((12, b"sign"),)),
        "retrain-request": ps.RetrainRequest(config, 6, b"agg-S"),
        "querier-state": ps.QuerierState(
            7, 6, 2, (ps.QuerierSessionState(12, _seed(338), _seed(339), arch, 99),)
        ),
    }
    for name, message in messages.items():
        out[f"secure-{name}"] = message.to_bytes().hex()
    out["secure-binding"] = ps.binding(run, 7, cfg, 6).params_digest.hex()
    return out


def dcf_vectors() -> dict[str, Any]:
    """DCF key shares and public parts from fixed master seeds (``FDCF``)."""
    from flwr_fsl.crypto import dcf

    out: dict[str, Any] = {}
    cases = [
        ("scalar-d8", [100], [5], 8),
        ("tau2-d16", [7, 60000], [[1, 2], [2**64 - 1, 0]], 16),
        ("d1", [1, 0], [9, 9], 1),
    ]
    for i, (name, alphas, betas, bits) in enumerate(cases):
        k0, k1 = dcf.generate_keys_batch(
            np.array(alphas, np.uint64),
            np.array(betas, np.uint64),
            bits,
            master_seeds=(_seed(400 + 2 * i), _seed(401 + 2 * i)),
        )
        points = np.array([min(a + 1, (1 << bits) - 1) for a in alphas], np.uint64)
        out[name] = {
            "key0": k0.to_bytes().hex(),
            "key1": k1.to_bytes().hex(),
            "public": k0.public.to_bytes().hex(),
            "paired0": _words(dcf.evaluate_paired(k0, points)),
        }
    return out


def helper_wire_messages() -> dict[str, Any]:
    """One helper wire message (``FSHW``) of every built-in kind, from fixed field values."""
    from flwr_fsl.helper import wire

    session = _seed(500)
    items = (
        wire.SealedItem(3, b"public-3", _blob(501, 40)),
        wire.SealedItem(2**64 - 1, b"", b"s"),
    )
    return {
        "HEALTH": wire.HealthRequest(),
        "PUBLIC_KEY": wire.PublicKeyRequest(),
        "OPEN_ROUND": wire.OpenRoundRequest(session, 7, b"params"),
        "OPEN_CHECKED_ROUND": wire.OpenCheckedRoundRequest(session, 7, b"params", _seed(506)),
        "ADD_CLIENTS": wire.AddClientsRequest(session, 7, items),
        "ADD_HINTS": wire.AddHintsRequest(
            session, 7, (wire.HintItem(4, b"hint", _blob(502, 20)), wire.HintItem(5, b"", b""))
        ),
        "FINISH_ROUND": wire.FinishRoundRequest(session, 8),
        "ABORT_ROUND": wire.AbortRoundRequest(session, 2**64 - 1),
        "SET_MODEL": wire.SetModelRequest(
            session, 7, np.arange(6, dtype=np.uint64).reshape(3, 2) * np.uint64(2**61)
        ),
        "PSR_ANSWER": wire.PsrAnswerRequest(session, 7, items[:1]),
        "CLOSE_SESSION": wire.CloseSessionRequest(session),
        "OPEN_SESSION": wire.OpenSessionRequest(),
        "OK": wire.OkResponse(),
        "HEALTH_INFO": wire.HealthResponse(3, _key(503).public_bytes),
        "PUBLIC_KEY_INFO": wire.PublicKeyResponse(_key(503).public_bytes),
        "CLIENT_RESULTS": wire.ClientResultsResponse(
            (wire.ClientResult(1, True, b""), wire.ClientResult(2, False, b"too late"))
        ),
        "SHARE": wire.ShareResponse((1, 2), np.array([[1, 2], [3, 2**64 - 1]], np.uint64)),
        "ARRAY": wire.ArrayMessage(np.array([0.5, -2.0], np.float32)),
        "SESSION_INFO": wire.SessionInfoResponse(session, _blob(504, 32)),
        "ADD_CHECKED": wire.AddCheckedRequest(
            session, 7, (wire.CheckedItem(3, b"public-3", _blob(504, 40), _blob(505, 32)),)
        ),
        "ADD_CHECKED_HINTS": wire.AddCheckedHintsRequest(
            session, 7, (wire.CheckedItem(4, b"hint", b"", b""),)
        ),
    }


def helper_wire_vectors() -> dict[str, Any]:
    """Hex of every message of :func:`helper_wire_messages`."""
    from flwr_fsl.helper import wire

    return {name: wire.encode(m).hex() for name, m in helper_wire_messages().items()}


def channel_vectors() -> dict[str, Any]:
    """The sealed box's fixed parts (header, overhead, HPKE info label) and associated data."""
    from flwr_fsl.crypto import channel

    digest = hashlib.sha256(b"params").digest()
    return {
        "header": channel._HEADER.hex(),
        "overhead": channel.OVERHEAD,
        "info-label": channel.INFO_LABEL.hex(),
        "ad-ssa": channel.associated_data(
            purpose="ssa",
            session=_seed(600),
            round=3,
            params_digest=digest,
            sender=channel.client_party(12),
            recipient="S1",
        ).hex(),
        "ad-unicode": channel.associated_data(
            purpose="pürpose",
            session=bytes(16),
            round=2**64 - 1,
            params_digest=bytes(32),
            sender="S1",
            recipient=channel.client_party(0),
        ).hex(),
        "fingerprint": channel.public_key_fingerprint(_key(601).public_bytes),
        "public-key": _key(601).public_bytes.hex(),
        "private-key": _key(601).private_bytes().hex(),
    }


SEALED_KEY = "sealed-ciphertexts"
"""Top-level key of the stored sealed boxes: sealing is randomized, so they are made once and
kept; :func:`sealed_opening_vectors` checks that today's code opens them to the same bytes."""
_FRESH: dict[str, str] = {}


def _binding() -> Any:
    from flwr_fsl.crypto.sealing import RoundBinding

    return RoundBinding.of(_seed(700), 11, b"round parameters")


def _signer() -> Any:
    from flwr_fsl.crypto.identity import SigningIdentity

    return SigningIdentity.from_private_bytes(hashlib.sha256(_seed(708)).digest())


def _seal_fresh() -> dict[str, str]:
    """Seal every case once (ephemeral keys and nonces are fresh: run only to (re)make them)."""
    from flwr_fsl.crypto import channel, sealing
    from flwr_fsl.families.ssa import sealing as ssa_sealing

    helper, client = _key(702), _key(704)
    binding = _binding()

    def unsigned(purpose: str, body: bytes) -> str:  # the v1 layout: the bare body
        ad = channel.associated_data(
            purpose=purpose, sender=channel.client_party(5), recipient="S1", **binding.fields()
        )
        return channel.seal(helper.public_bytes, body, associated_data=ad).hex()

    query, _ = ssa_sealing.seal_psr_query(
        helper.public_bytes, binding=binding, client_id=5, public_part=b"pp", master_seed=_seed(706)
    )
    return {
        "raw": channel.seal(
            helper.public_bytes, b"fixed plaintext", associated_data=_raw_ad()
        ).hex(),
        "empty": channel.seal(helper.public_bytes, b"", associated_data=_raw_ad()).hex(),
        "ssa-upload": unsigned(ssa_sealing.SSA, _seed(705) + hashlib.sha256(b"pp").digest()),
        "udpf-hint": unsigned(
            ssa_sealing.UDPF_HINT,
            hashlib.sha256(b"hint").digest() + hashlib.sha256(b"held").digest(),
        ),
        "ssa-upload-v2": ssa_sealing.seal_ssa_upload(
            helper.public_bytes,
            binding=binding,
            client_id=5,
            public_part=b"pp",
            master_seed=_seed(705),
            signer=_signer(),
        ).hex(),
        "udpf-hint-v2": ssa_sealing.seal_udpf_hint(
            helper.public_bytes,
            binding=binding,
            client_id=5,
            hint=b"hint",
            held=hashlib.sha256(b"held").digest(),
            signer=_signer(),
        ).hex(),
        "psr-query": query.hex(),
        "psr-answer": ssa_sealing.seal_psr_answer(
            client.public_bytes,
            np.array([[1, 2], [3, 2**64 - 1]], np.uint64),
            binding=binding,
            client_id=5,
        ).hex(),
        "seal-for": sealing.seal_for(
            client.public_bytes,
            b"client to client",
            purpose="sesa-evaluations",
            binding=binding,
            sender=channel.client_party(6),
            recipient=channel.client_party(5),
        ).hex(),
    }


def _raw_ad() -> bytes:
    from flwr_fsl.crypto import channel

    return channel.associated_data(
        purpose="frozen",
        session=_seed(707),
        round=1,
        params_digest=bytes(32),
        sender="S0",
        recipient="S1",
    )


def sealed_ciphertexts() -> dict[str, str]:
    """The stored sealed boxes (``frozen.json``), or new ones sealed once if none are stored."""
    stored: dict[str, str] = {}
    if PATH.exists():
        stored = dict(json.loads(PATH.read_text()).get(SEALED_KEY) or {})
    if not _FRESH:
        _FRESH.update(_seal_fresh())
    return {**_FRESH, **stored} if set(_FRESH) - set(stored) else stored


def sealed_opening_vectors() -> dict[str, Any]:
    """Open the stored sealed boxes with keys from fixed seeds: the plaintexts (raw, and what
    each ``open_*`` returns), the header and the overhead."""
    from flwr_fsl.crypto import channel, sealing
    from flwr_fsl.families.ssa import sealing as ssa_sealing

    helper, client = _key(702), _key(704)
    binding = _binding()
    blobs = {name: bytes.fromhex(h) for name, h in sealed_ciphertexts().items()}

    def ad(purpose: str, sender: str, recipient: str) -> bytes:
        return channel.associated_data(
            purpose=purpose, sender=sender, recipient=recipient, **binding.fields()
        )

    c5, c6 = channel.client_party(5), channel.client_party(6)
    raw = {
        "raw": channel.open_sealed(helper, blobs["raw"], associated_data=_raw_ad()),
        "empty": channel.open_sealed(helper, blobs["empty"], associated_data=_raw_ad()),
        "ssa-upload": channel.open_sealed(
            helper, blobs["ssa-upload"], associated_data=ad(ssa_sealing.SSA, c5, "S1")
        ),
        "udpf-hint": channel.open_sealed(
            helper, blobs["udpf-hint"], associated_data=ad(ssa_sealing.UDPF_HINT, c5, "S1")
        ),
        "ssa-upload-v2": channel.open_sealed(
            helper, blobs["ssa-upload-v2"], associated_data=ad(ssa_sealing.SSA, c5, "S1")
        ),
        "udpf-hint-v2": channel.open_sealed(
            helper, blobs["udpf-hint-v2"], associated_data=ad(ssa_sealing.UDPF_HINT, c5, "S1")
        ),
        "psr-query": channel.open_sealed(
            helper, blobs["psr-query"], associated_data=ad(ssa_sealing.PSR_QUERY, c5, "S1")
        ),
        "psr-answer": channel.open_sealed(
            client, blobs["psr-answer"], associated_data=ad(ssa_sealing.PSR_ANSWER, "S1", c5)
        ),
        "seal-for": channel.open_sealed(
            client, blobs["seal-for"], associated_data=ad("sesa-evaluations", c6, c5)
        ),
    }
    seed, answer_key = ssa_sealing.open_psr_query(
        helper, blobs["psr-query"], binding=binding, client_id=5, public_part=b"pp"
    )
    upload = ssa_sealing.open_ssa_upload(
        helper, blobs["ssa-upload-v2"], binding=binding, client_id=5, public_part=b"pp"
    )
    hint = ssa_sealing.open_udpf_hint(
        helper, blobs["udpf-hint-v2"], binding=binding, client_id=5, hint=b"hint"
    )

    def refused(open_v1: Any, blob: bytes, **kw: Any) -> str:
        try:
            open_v1(helper, blob, binding=binding, client_id=5, **kw)
        except channel.SealedBoxError as err:
            return f"refused: {err}"
        raise AssertionError("an unsigned v1 box opened")

    opened = {
        "ssa-upload": refused(ssa_sealing.open_ssa_upload, blobs["ssa-upload"], public_part=b"pp"),
        "udpf-hint": refused(ssa_sealing.open_udpf_hint, blobs["udpf-hint"], hint=b"hint"),
        "ssa-upload-v2": upload.master_seed.hex() + ":" + upload.signer.hex(),
        "udpf-hint-v2": hint.held.hex() + ":" + hint.signer.hex(),
        "psr-query": seed.hex() + ":" + answer_key.hex(),
        "psr-answer": _words(
            ssa_sealing.open_psr_answer(client, blobs["psr-answer"], binding=binding, client_id=5)
        ),
        "seal-for": sealing.open_from(
            client,
            blobs["seal-for"],
            purpose="sesa-evaluations",
            binding=binding,
            sender=c6,
            recipient=c5,
        ).hex(),
    }
    out: dict[str, Any] = {}
    for name, plain in raw.items():
        blob = blobs[name]
        out[name] = {
            "plaintext": plain.hex(),
            "header": blob[: len(channel._HEADER)].hex(),
            "overhead": len(blob) - len(plain),
            "opened": opened.get(name, plain.hex()),
        }
    out["binding-digest"] = binding.params_digest.hex()
    return out


def perturb_vectors() -> dict[str, Any]:
    """The randomized-response memo (``FSRR``)."""
    from flwr_fsl.families.sfsl.perturb import PermanentMemo

    drawn = PermanentMemo(np.array([1, 4, 2**40]), np.array([0, 7]), (15 / 16, 1 / 16))
    return {
        "empty": PermanentMemo().to_bytes().hex(),
        "memo": PermanentMemo(np.array([1, 4, 2**40]), np.array([0, 7])).to_bytes().hex(),
        "memo-v2": drawn.to_bytes().hex(),  # issue 20: the memo records its p1, p2
    }


def union_vectors() -> dict[str, Any]:
    """PSU client vectors, Niu's row vector and SFSL's memo scope names."""
    from flwr_fsl.crypto.fixedpoint import FixedPoint
    from flwr_fsl.crypto.prg import PRGStream
    from flwr_fsl.families.sfsl import mod as sfsl
    from flwr_fsl.families.sfsl.protocol import GammaQuantizer, RowVector
    from flwr_fsl.families.sfsl.psu import PSUParams, client_vector

    bloom = PSUParams(100, 64, 3, 4, _seed(800))
    exact = PSUParams.exact(20)
    rows = RowVector(np.array([2, 5, 9], np.int64), 2, FixedPoint(16, 1000.0, 10))
    quantized = RowVector(
        np.array([2, 5], np.int64), 2, FixedPoint(8, 1e6, 10), GammaQuantizer(16, -1.0, 1.0)
    )
    deltas = {5: np.array([0.5, -0.25]), 9: np.array([1.0, 2.0])}
    return {
        "psu-bloom": _words(client_vector(bloom, [3, 50, 99], PRGStream.from_seed(_seed(801)))),
        "psu-exact": _words(client_vector(exact, [0, 19], PRGStream.from_seed(_seed(802)))),
        "niu-rows": _words(rows.encode([5, 9], deltas, {5: 2, 9: 1.5}, np.random.default_rng(3))),
        "niu-quantized": _words(
            quantized.encode([5], {5: deltas[5]}, {5: 3}, np.random.default_rng(4))
        ),
        "sfsl-scopes": [sfsl._scope(s) for s in (None, b"\x00\x01", "run-1", 42)],
    }


def client_state_vectors() -> dict[str, Any]:
    """SSA (``FSCS``) and PSR (``FSPQ``) client states from fixed seeds."""
    from flwr_fsl.families.ssa.psr import PSRClientState, make_query

    # digest version 1: pinned, the default when these were frozen (the state holds the params)
    params = SSAParams(5, 64, 5, 2, _seed(900), stash_size=2, verify=False, projected_digest=1)
    indices = np.array([2, 9, 33, 60], dtype=np.int64)
    states = [
        encode_update(
            p,
            indices,
            np.arange(8, dtype=np.float64).reshape(4, 2),
            np.array([1.0, 2.0, 3.0, 0.5]),
            rng=np.random.default_rng(6),
            master_seeds=(_seed(901), _seed(902)),
        )[1]
        for p in (params, replace(params, verify=True, value_check="off"))  # checked keys
    ]
    query = make_query(
        params, indices[:3], rng=np.random.default_rng(7), master_seeds=(_seed(903), _seed(904))
    )
    psr = PSRClientState(9, query.indices, query.placement.slots, _key(905))
    counted = PSRClientState(
        9, query.indices, query.placement.slots, _key(905), np.array([1.0, 2.5, 3.0])
    )
    return {
        "ssa-state": _h(states[0].to_bytes()),
        "ssa-state-checked": _h(states[1].to_bytes()),
        "psr-query-public": _h(query.upload.public_part),
        "psr-state": psr.to_bytes().hex(),
        "psr-state-counts": counted.to_bytes().hex(),
    }


def secagg_settings_vectors() -> dict[str, Any]:
    """SecAgg's one versioned settings record (``FSAS``): defaults and a full set of fields.

    ``full`` and ``v1-default`` are sample-weighted without DP: version 1, the bytes every
    SecAgg round carried before unit weights (``default`` before issue 20 is ``v1-default``).
    ``default`` (unit weights) and ``dp`` are version 2.
    """
    from flwr_fsl.families.secagg.dp import SecAggDP
    from flwr_fsl.families.secagg.messages import SecAggSettings

    full = SecAggSettings(
        names=("conv.weight", "fc.bias"),
        metrics=("train_loss", "train_acc"),
        weight_key="num-examples",
        clip=4.0,
        max_weight=1e5,
        max_metric=1e3,
        frac_bits=20,
        max_clients=500,
        weighted=True,
    )
    dp = SecAggSettings(
        names=("conv.weight", "fc.bias"),
        metrics=(),
        clip=4.0,
        max_metric=10.0,
        frac_bits=20,
        max_clients=500,
        dp=SecAggDP(noise_multiplier=1.1, clip_norm=2.0),
    )
    return {
        "default": SecAggSettings().to_bytes().hex(),
        "full": full.to_bytes().hex(),
        "v1-default": SecAggSettings(weighted=True).to_bytes().hex(),
        "dp": dp.to_bytes().hex(),
    }


def sfsl_settings_vectors() -> dict[str, Any]:
    """SFSL's one versioned settings record (``FSFL``): defaults, and quantized with PSU."""
    from flwr_fsl.families.sfsl.dp import SFSLDP
    from flwr_fsl.families.sfsl.messages import SFSLSettings
    from flwr_fsl.families.sfsl.psu import PSUParams

    full = SFSLSettings(
        table="item_emb.weight",
        weight_key="num-examples",
        clip=4.0,
        max_count=100.0,
        frac_bits=20,
        max_clients=500,
        levels=2**15,
        psu=PSUParams(1000, 1440, 10, 4, bytes(range(16))),
    )
    # Version 2 (issue 20): unweighted, and with the distributed-DP settings.
    dp = SFSLSettings(
        table="item_emb.weight",
        weighted=False,
        dp=SFSLDP(noise_multiplier=1.5, clip_norm=0.5, count_clip=2.0, max_rows=48),
        psu=PSUParams.exact(1000),
    )
    return {
        "default": SFSLSettings("emb").to_bytes().hex(),
        "full": full.to_bytes().hex(),
        "v2-unweighted": SFSLSettings("emb", weighted=False).to_bytes().hex(),
        "v2-dp": dp.to_bytes().hex(),
    }


def sfsl_shared_runs_vectors() -> dict[str, Any]:
    """SFSL's shared positions per peer as runs: rows of 3 positions, a gap, one empty peer."""
    from flwr_fsl.families.sfsl.messages import encode_shared_runs

    shared = {
        4: np.array([0, 1, 2, 6, 7, 8, 9, 10, 11], np.int64),
        9: np.array([5], np.int64),
        12: np.zeros(0, np.int64),
    }
    return {"runs": encode_shared_runs(shared).hex(), "length": 12}


def topk_residual_vectors() -> dict[str, Any]:
    """top-k's error-feedback state (``FSTK``): empty, and float32/float16/int64 tensors."""
    from flwr_fsl.families.topk.mod import Residual

    full = Residual(
        "run-7",
        {
            "fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
            "emb": np.array([[0.5, -1.25]], dtype=np.float16),
            "steps": np.array(3, dtype=np.int64),
        },
    )
    return {"empty": Residual("").to_bytes().hex(), "full": full.to_bytes().hex()}


def width_settings_vectors() -> dict[str, Any]:
    """The width family's one versioned settings record (``FSWS``): default and another key."""
    from flwr_fsl.families.width.settings import WidthSettings

    return {
        "default": WidthSettings().to_bytes().hex(),
        "full": WidthSettings("train-config").to_bytes().hex(),
    }


def sesa_settings_vectors() -> dict[str, Any]:
    """SESA's one versioned settings record (``FSES``): defaults, and with a layer structure."""
    from flwr_fsl.families.sesa.settings import SesaSettings

    full = SesaSettings(
        num_shards=4,
        weighted=False,
        weight_key="num-examples",
        max_weight=100.0,
        clip=4.0,
        frac_bits=20,
        max_clients=50,
        config_key="config",
        layers=("fc1", "fc2"),
        widths=(8, 16),
        groups=("node:fc1", "pair:fc2", "common"),
    )
    return {
        # The record with v1's defaults as they were frozen: issue 20 made weighted=False the
        # default (a default, not the format: "full" freezes weighted=0's bytes).
        "default": SesaSettings(weighted=True).to_bytes().hex(),
        "full": full.to_bytes().hex(),
    }


def ssa_range_check_vectors() -> dict[str, Any]:
    """SSA parameter version 6 (``value_check="exact"``): encodings, a checked client's upload
    with its range trailer, both servers' shares, the client state, and the range check's
    material and both servers' check blobs from fixed seeds (a fixed query seed)."""
    from flwr_fsl.families.ssa import range_check

    out: dict[str, Any] = {}
    params = {
        "topk": SSAParams(1, 1000, 30, 1, _seed(1100), value_check="exact"),
        "rows": SSAParams(
            7, 64, 5, 4, _seed(1101), stash_size=2, frac_bits=16, value_check="exact"
        ),
        "unit-dp-run": SSAParams(
            7,
            64,
            5,
            4,
            _seed(1101),
            frac_bits=16,
            dp=_DP,
            run=_RUN,
            weighted=False,
            value_check="exact",
        ),
        "epoch": SSAParams(3, 64, 5, 2, _seed(1102), epoch=2, max_abs=4.0, value_check="exact"),
    }
    for name, p in params.items():
        out[f"params-{name}"] = p.to_bytes().hex()
    rows = params["rows"]
    indices = np.array([2, 9, 33, 60], dtype=np.int64)
    values = np.arange(16, dtype=np.float64).reshape(4, 4) / 8 - 1
    upload, state = encode_update(
        rows,
        indices,
        values,
        np.array([1.0, 2.0, 3.0, 0.5]),
        rng=np.random.default_rng(5),
        master_seeds=(_seed(1103), _seed(1104)),
    )
    out["upload-public"] = _h(upload.public_part)
    out["trailer"] = _h(range_check.split_trailer(rows, upload.public_part)[1])
    out["trailer-bytes"] = range_check.trailer_bytes(rows)
    out["client-state"] = _h(state.to_bytes())
    out["shares"] = _server_shares(rows, upload)
    # The range check on its own: 3 value words under a bound of 1000.
    bound = 1000
    words = np.array([0, 1000, 2**64 - 1000], np.uint64)  # 0, bound, -bound
    material = range_check.make_upload(
        words, bound, seed1=_seed(1105), blind0=_seed(1106), prover=_seed(1107)
    )
    out["material"] = {
        "shares0": _words(material.shares0),
        "proof0": _words(material.proof0),
        "parts": (material.part0 + material.part1).hex(),
    }
    value0 = np.array([5, 2**63, 77], np.uint64)  # any additive split of the words
    value1 = words - value0
    public = (material.part0, material.part1)
    checks = [
        range_check.server_check(party, v, bound, public, private, _seed(1108)).to_bytes()
        for party, v, private in ((0, value0, material), (1, value1, material.seed1))
    ]
    out["server-checks"] = [_h(c) for c in checks]
    out["checks-agree"] = range_check.same_check(checks[0], checks[1])
    return out


def psu_vectors() -> dict[str, Any]:
    """Cui's PSU over two servers (``FSPU`` parameters, ``families/ssa/union.py``): the
    parameter encodings and their round binding, what a sealed seed is bound to, S1's share
    from a seed, the two servers' totals and the opened union for fixed client vectors, the
    union config field, and S1's helper messages (``PSU_SUM``, ``PSU_TOTAL``)."""
    from flwr_fsl.crypto import channel
    from flwr_fsl.crypto.prg import PRGStream
    from flwr_fsl.crypto.psu import PSUParams, client_vector
    from flwr_fsl.families.ssa import union
    from flwr_fsl.helper import wire
    from flwr_fsl.helper.services.psu import PsuSumRequest, PsuTotalResponse, SeedItem

    exact = PSUParams.exact(20)
    bloom = PSUParams(100, 64, 3, 4, _seed(1200))
    binding = union.psu_binding(_seed(1201), 5, bloom)
    out: dict[str, Any] = {
        "params-exact": union.psu_params_to_bytes(exact).hex(),
        "params-bloom": union.psu_params_to_bytes(bloom).hex(),
        "binding-digest": binding.params_digest.hex(),
        "seed-ad": channel.associated_data(
            purpose=union.PSU_SEED,
            sender=channel.client_party(5),
            recipient="S1",
            **binding.fields(),
        ).hex(),
        "sealed-seed-bytes": union.SEALED_SEED_BYTES,
    }
    for name, psu in (("exact", exact), ("bloom", bloom)):
        sets = {3: [0, 7, 19], 8: [7, 12]} if psu is exact else {3: [1, 50, 99], 8: [50, 64]}
        parties = (union.UnionParty(psu, 0), union.UnionParty(psu, 1))
        for client, items in sets.items():
            seed = _seed(1210 + client)
            vector = client_vector(psu, items, PRGStream.from_seed(_seed(1220 + client)))
            parties[0].add(client, vector - union.helper_vector(psu, seed))
            parties[1].add(client, seed)
        share = union.share_set(psu, sets[3], seed=_seed(1213))  # its vector is fresh
        support = share.lead_vector + union.helper_vector(psu, _seed(1213))
        out[f"{name}-helper-vector"] = _words(union.helper_vector(psu, _seed(1213)))
        out[f"{name}-share-support"] = [int(v) for v in np.flatnonzero(support)]
        out[f"{name}-totals"] = [_words(parties[0].total), _words(parties[1].total)]
        opened = union.open_union(psu, parties[0].total, parties[1].total)
        out[f"{name}-union"] = [int(v) for v in opened]
    out["union-field"] = (
        union.UnionRound(20, np.array([0, 7, 12, 19], np.int64)).union.astype("<i8").tobytes().hex()
    )
    session = _seed(1230)
    messages = {
        "PSU_SUM": PsuSumRequest(
            session,
            5,
            union.psu_params_to_bytes(bloom),
            (SeedItem(3, _blob(1231, union.SEALED_SEED_BYTES)), SeedItem(2**64 - 1, b"")),
        ),
        "PSU_TOTAL": PsuTotalResponse(
            (wire.ClientResult(3, True, b""), wire.ClientResult(8, False, b"bad seed")),
            np.array([0, 2**64 - 1, 5], np.uint64),
        ),
    }
    out.update((f"wire-{k}", wire.encode(m).hex()) for k, m in messages.items())
    return out


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "dpf": dpf_vectors,
    "prg": prg_vectors,
    "hashing": hashing_vectors,
    "ssa": ssa_vectors,
    "ssa-key-check": ssa_key_check_vectors,
    "ssa-projected-digest2": ssa_projected_digest2_vectors,
    "ssa-default-round": ssa_default_round_vectors,
    "fixedpoint": fixedpoint_vectors,
    "codec": codec_vectors,
    "secagg": secagg_vectors,
    "sesa": sesa_vectors,
    "width": width_vectors,
    "privhfl": privhfl_vectors,
    "dcf": dcf_vectors,
    "helper-wire": helper_wire_vectors,
    "channel": channel_vectors,
    "sealed-openings": sealed_opening_vectors,
    "perturb": perturb_vectors,
    "union": union_vectors,
    "client-state": client_state_vectors,
    "secagg-settings": secagg_settings_vectors,
    "sfsl-settings": sfsl_settings_vectors,
    "sfsl-shared-runs": sfsl_shared_runs_vectors,
    "topk-residual": topk_residual_vectors,
    "width-settings": width_settings_vectors,
    "sesa-settings": sesa_settings_vectors,
    "ssa-range-check": ssa_range_check_vectors,
    "psu": psu_vectors,
}


def compute() -> dict[str, Any]:
    """Compute every section's vectors from the current code (JSON-normalized)."""
    data: dict[str, Any] = {SEALED_KEY: sealed_ciphertexts()}
    data.update((name, fn()) for name, fn in SECTIONS.items())
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
