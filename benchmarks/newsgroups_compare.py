"""20 Newsgroups with its classifier federated: dense vs top-k mega-elements vs index mode.

Issue 22 item 6, Cui et al. Table 8's question at CPU scale: what do top-k with mega-elements
(rows of the embedding table chosen by L1 norm, Cui §6 and §7.4) and index mode (each client's
own word rows through PSR + row SSA) cost and reach against dense FedAvg, on one bag-of-
embeddings classifier (``examples/dpf-psr-newsgroups``'s model: document vector = weighted
mean of its words' embeddings, logits = head x vector; word embeddings start at zero).

Arms (same clients, data, local training, rounds and seed):

- ``dense``: FedAvg (``FedSubAvg`` on dense replies, weighted by ``num-examples``);
  both plaintext arms run with ``clipping_range=None`` (no per-coordinate clip, as the
  secure arms: with error feedback a head coordinate's change exceeds FedSubAvg's default
  clip of 8, which would make plaintext differ from secure);
- ``topk-mega``: plaintext top-k with mega-elements (``topk_mod``, ``topk-groups=emb.weight``:
  ``ceil(r * V)`` embedding rows by L1 norm plus ``ceil(r * C * dim)`` head coordinates; unit
  weights, error feedback on);
- ``secure-topk-mega``: the same through two-server SSA (``SecureFedSubAvg(groups=...)``,
  ``ssa_mod``, in-process S1; one SSA instance, every key ``dim + 1`` words, head coordinates
  zero-padded); it must reach ``topk-mega``'s accuracy up to fixed-point error;
- ``index``: index mode as ``examples/dpf-psr-newsgroups`` runs it (``SecureRowFedSubAvg``
  over :func:`model_tables`: PSR + row SSA for each client's ``max-rows`` word rows, the head
  a dense part of the same two-server round — the mixed rounds of issue 22 item 1, fresh keys
  every round), at its defaults (distributed DP, ``z = 1``, budget ``ε = 20``) and
  ``index-nodp`` (DP off, node floor 0).

Columns: test accuracy after the last round; download and upload bytes per client per round
(message contents, all phases, as :attr:`~flwr_fsl.core.engine.PhasedStrategy.traffic`
records them); client time per client per round (the whole ClientApp: training, top-k, keys,
PSR); server time per round (wall time minus client time: S0 and the in-process S1 together).
Everything runs in one process, clients one after the other; timings under load are noisy:
compare ratios within one run. Also printed: a secure top-k client's upload with the padded
single instance against one SSA instance per width (rows, coordinates), keys encoded both ways.

    python benchmarks/newsgroups_compare.py            # ~5-8 min on 2 cores
    python benchmarks/newsgroups_compare.py --quick    # seconds (the test runs this)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "dpf-psr-newsgroups"))
sys.path.insert(0, str(REPO))

import dpf_psr_newsgroups.client_app as index_client  # noqa: E402
from dpf_psr_newsgroups.task import (  # noqa: E402
    HEAD,
    TABLE,
    Settings,
    client_data,
    evaluate,
    initial_model,
    model_tables,
    table_shape,
    test_documents,
    train_client,
)
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.clientapp.typing import ClientAppCallable, Mod  # noqa: E402

from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY  # noqa: E402
from flwr_fsl.crypto.channel import SealingKeyPair  # noqa: E402
from flwr_fsl.families.ssa.protocol import SSAParams, encode_update  # noqa: E402
from flwr_fsl.helper import InProcessHelper  # noqa: E402
from flwr_fsl.mods import ssa_mod, topk_mod  # noqa: E402
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg, SecureRowFedSubAvg  # noqa: E402
from flwr_fsl.submodel import TopKConfig, sparsify  # noqa: E402
from flwr_fsl.submodel.mega_layout import MegaLayout  # noqa: E402
from flwr_fsl.testing import InProcessGrid  # noqa: E402

EMB = TABLE
ARMS = ("dense", "topk-mega", "secure-topk-mega", "index", "index-nodp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--vocab", type=int, default=2000, help="embedding rows V (most frequent)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--max-rows", type=int, default=512, help="index mode: rows per client")
    p.add_argument(
        "--ratios",
        default="0.01,0.05,0.1,0.3",
        help="top-k ratios r of the two top-k arms (Table 8's compression rates)",
    )
    p.add_argument("--test-docs", type=int, default=3000)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quick", action="store_true", help="2 rounds, 4 clients, V=300, 300 docs")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    args.ratio_list = [float(r) for r in args.ratios.split(",") if r.strip()]
    if args.quick:
        args.ratio_list = args.ratio_list[-1:]
        args.rounds, args.clients, args.vocab, args.max_rows, args.test_docs = 2, 4, 300, 128, 300
    return args


def settings_of(args: argparse.Namespace) -> Settings:
    """Return the example's task settings for this comparison."""
    return Settings(
        vocab_size=args.vocab,
        dim=args.dim,
        max_rows=args.max_rows,
        test_docs=args.test_docs,
        seed=args.seed,
        min_nodes=args.clients,
        local_epochs=2,
    )


def run_config(settings: Settings) -> dict[str, Any]:
    """Return the run config the example's ClientApp reads (dashes)."""
    keys = ("vocab_size", "dim", "max_rows", "test_docs", "seed", "local_epochs", "min_nodes")
    return {k.replace("_", "-"): getattr(settings, k) for k in keys}


class ClientClock:
    """An outermost mod that adds up the time the ClientApp spends per message."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Time the rest of the app."""
        start = time.perf_counter()
        try:
            return call_next(msg, context)
        finally:
            self.seconds += time.perf_counter() - start


def split_app(mods: list[Mod]) -> ClientApp:
    """Return a ClientApp over ``{emb.weight, head.weight}`` (the example's training)."""
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        settings = Settings.from_run_config(context.run_config)
        pid, num = (
            int(context.node_config["partition-id"]),
            int(context.node_config["num-partitions"]),
        )
        data = client_data(pid, num, settings)
        arrays = msg.content.array_records["arrays"]
        rnd = int(msg.content["config"].get("server-round", 0))  # type: ignore[arg-type]
        trained, head, loss = train_client(
            arrays[EMB].numpy(),
            arrays[HEAD].numpy(),
            data,
            table_shape(settings),
            epochs=settings.local_epochs,
            lr=settings.lr,
            batch_size=settings.batch_size,
            seed=settings.seed * 1_000_003 + 1000 * rnd + pid,
        )
        out = ArrayRecord({EMB: Array(trained), HEAD: Array(head)})
        metrics = MetricRecord({"train-loss": loss, "num-examples": len(data.docs)})
        return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)

    return app


def unit_weight(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Plaintext top-k with unit weights (what the secure arm computes): num-examples = 1."""
    reply = call_next(msg, context)
    if msg.metadata.message_type == "train" and reply.has_content():
        for record in reply.content.metric_records.values():
            record["num-examples"] = 1
    return reply


def _arm(
    name: str, args: argparse.Namespace, settings: Settings, key: SealingKeyPair, ratio: float
):  # type: ignore[no-untyped-def]
    """Return (strategy, ClientApp, clock, node config, initial arrays) of one arm."""
    clock = ClientClock()
    split = ArrayRecord({k: Array(v) for k, v in initial_model(settings).items()})
    helper = InProcessHelper(keypair=key)
    common: dict[str, Any] = {"min_available_nodes": args.clients, "fraction_evaluate": 0.0}
    node: Callable[[int], dict[str, Any]] = lambda i: {  # noqa: E731
        "partition-id": i,
        "num-partitions": args.clients,
    }
    # Plaintext arms without FedSubAvg's default per-coordinate clip (8.0): the secure arms
    # have none (values bounded by max_abs), and error feedback makes head changes exceed 8.
    if name == "dense":
        return FedSubAvg(clipping_range=None, **common), split_app([clock.mod]), clock, node, split
    if name == "topk-mega":
        app = split_app([clock.mod, unit_weight, topk_mod])
        return FedSubAvg(clipping_range=None, **common), app, clock, node, split
    if name == "secure-topk-mega":
        strategy = SecureFedSubAvg(
            helper,
            ratio,
            helper_fingerprint=key.fingerprint,
            groups=(EMB,),
            dp=None,  # as Cui's Table 8 (the library's default with groups adds DP)
            **common,
        )
        return strategy, split_app([clock.mod, ssa_mod, topk_mod]), clock, node, split
    nodp = name == "index-nodp"
    strategy = SecureRowFedSubAvg(
        helper,
        model_tables(settings),  # the word table; the head is a dense part of the round
        helper_fingerprint=key.fingerprint,
        **({"dp": None} if nodp else {}),
        **common,
    )
    if nodp:

        def node(i: int) -> dict[str, Any]:
            return {"partition-id": i, "num-partitions": args.clients, NODE_MIN_NOISE_KEY: 0.0}

    # The example's ClientApp (PrivateRows mod, its train and query.psr), clock outermost.
    app = ClientApp(mods=[clock.mod, index_client.rows.mod])  # PrivateTables
    app.train()(index_client.train)
    app.query("psr")(index_client.query)
    return strategy, app, clock, node, split


def run_arm(
    name: str, args: argparse.Namespace, settings: Settings, ratio: float = 1.0
) -> dict[str, Any]:
    """Run one arm (top-k arms at ``ratio``); return its row (accuracy, bytes, times)."""
    key = SealingKeyPair.generate()
    strategy, app, clock, node, initial = _arm(name, args, settings, key, ratio)
    config = {
        **run_config(settings),
        "ssa-helper-fingerprint": key.fingerprint,
        "topk-ratio": ratio,
        "topk-groups": EMB,
    }
    if name in ("dense", "index", "index-nodp", "secure-topk-mega"):
        config.pop("topk-ratio")  # the secure strategy sends its own; dense/index: no top-k
        config.pop("topk-groups")
    grid = InProcessGrid(app, args.clients, config, node_config_fn=node)
    start = time.perf_counter()
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=args.rounds)
    wall = time.perf_counter() - start
    arrays = {k: v.numpy() for k, v in result.arrays.items()}
    loss, acc = evaluate(arrays[EMB], arrays[HEAD], test_documents(settings), table_shape(settings))
    traffic = strategy.traffic
    rounds_run = len({t.server_round for t in traffic if t.phase == "train"})
    per = max(1, rounds_run * args.clients)  # a DP run may stop early (privacy budget)
    down = sum(sum(t.down_bytes.values()) for t in traffic) / per
    up = sum(sum(t.up_bytes.values()) for t in traffic) / per
    return {
        "arm": name,
        "ratio": ratio,
        "accuracy": acc,
        "loss": loss,
        "down_bytes": down,
        "up_bytes": up,
        "client_s": clock.seconds / per,
        "server_s": (wall - clock.seconds) / max(1, rounds_run),
        "rounds": rounds_run,
        "failed_rounds": len(strategy.failed_rounds),
    }


def padding_bytes(args: argparse.Namespace, settings: Settings, ratio: float) -> dict[str, int]:
    """One client's first top-k update encoded as one padded instance vs one per width."""
    rng = np.random.default_rng(args.seed)
    model = initial_model(settings)
    data = client_data(0, args.clients, settings)
    emb, head, _ = train_client(
        model[EMB],
        model[HEAD],
        data,
        table_shape(settings),
        epochs=1,
        lr=settings.lr,
        batch_size=32,
        seed=1,
    )
    delta = {EMB: emb - model[EMB], HEAD: head - model[HEAD]}
    update, _ = sparsify(delta, TopKConfig(ratio=ratio, groups=(EMB,), error_feedback=False))
    layout = MegaLayout.of(model, (EMB,))
    sizes = layout.group_sizes()
    k_rows, k_rest = (min(n, math.ceil(ratio * n)) for n in (sizes[EMB], sizes[""]))

    def upload(m: int, k: int, width: int, idx: Any, vals: Any) -> int:
        params = SSAParams(1, m, k, width, rng.bytes(16), weighted=False, max_abs=1e5)
        up, _ = encode_update(params, idx, vals, 1.0, rng=rng)
        return len(up.public_part) + sum(len(s) for s in up.master_seeds)

    el = layout.elements(update)
    padded = upload(layout.size, k_rows + k_rest, layout.width, el.indices, el.values)
    rows = el.indices < sizes[EMB]
    split = upload(sizes[EMB], k_rows, args.dim, el.indices[rows], el.values[rows]) + upload(
        sizes[""], k_rest, 1, el.indices[~rows] - sizes[EMB], el.values[~rows, :1]
    )
    return {"k_rows": k_rows, "k_coords": k_rest, "padded": padded, "per_width": split}


def main(argv: list[str] | None = None) -> int:
    """Run the arms and print the table."""
    args = parse_args(argv)
    settings = settings_of(args)
    shape = table_shape(settings)
    print(
        f"20 Newsgroups: V={shape.num_words} words x dim {args.dim}, head {shape.num_classes} x "
        f"{args.dim}; {args.clients} clients (Dirichlet), {args.rounds} rounds, top-k r in "
        f"{args.ratio_list}, index max-rows={args.max_rows}, {args.test_docs or 'all'} test docs"
    )
    for pid in range(args.clients):  # load and cache the data before any arm is timed
        client_data(pid, args.clients, settings)
    test_documents(settings)
    rows = []
    for name in [a.strip() for a in args.arms.split(",") if a.strip()]:
        if name not in ARMS:
            raise SystemExit(f"unknown arm {name!r}; arms: {', '.join(ARMS)}")
        for ratio in args.ratio_list if "topk" in name else [1.0]:
            rows.append(run_arm(name, args, settings, ratio))
            _print_row(rows[-1])
    pads = [padding_bytes(args, settings, r) for r in args.ratio_list]
    for ratio, pad in zip(args.ratio_list, pads, strict=True):
        print(
            f"secure top-k upload of one client at r={ratio} ({pad['k_rows']} rows + "
            f"{pad['k_coords']} head coordinates): one padded instance "
            f"{pad['padded'] / 1e3:.1f} kB, one instance per width {pad['per_width'] / 1e3:.1f} kB"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {k: str(v) for k, v in vars(args).items()}
        args.out.write_text(json.dumps({"args": meta, "rows": rows, "padding": pads}, indent=1))
    return 0


def _print_row(r: dict[str, Any]) -> None:
    label = r["arm"] + (f" r={r['ratio']}" if "topk" in r["arm"] else "")
    print(
        f"  {label:<24} acc {r['accuracy']:.3f}  down {r['down_bytes'] / 1e3:9.1f} kB  "
        f"up {r['up_bytes'] / 1e3:8.1f} kB  client {r['client_s'] * 1e3:7.1f} ms  "
        f"server {r['server_s'] * 1e3:7.1f} ms/round  rounds {r['rounds']} "
        f"(failed {r['failed_rounds']})",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
