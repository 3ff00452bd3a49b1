"""Cross-round attack on SSA top-k mode with the MNIST CNN of ``examples/dpf-ssa-mnist``.

S0 (the curious ServerApp) keeps, every round, the count word it reconstructs per coordinate
(with the default unit weights: how many of the round's clients chose it) and the
participation it chose. If a client's top-k set is stable across rounds, the count words of
rounds with changing participants determine it: least squares over the rounds
(``tests/attacks/solvers.py``) gives each client's choice frequency per coordinate, and a
coordinate only one client chose in a round is then named (its value is in the aggregate:
sum / count). This script measures that on the example's own client code (its CNN, its
training loop, ``topk_mod`` with or without error feedback) on the in-process grid, and prints
the attacker's success beside chance:

- *sole chooser named*: for every (round, coordinate) with count 1, S0 names the participant
  with the largest estimated frequency; chance is 1 / (participants of the round);
- *membership*: per (client, coordinate), "chooses it in most of its rounds", thresholded
  estimate vs truth; chance is the best guess that treats the clients alike (per coordinate
  the majority class).

Usage::

    python benchmarks/attack_ssa_topk_mnist.py --rounds 40 --clients 20 --error-feedback on
    python benchmarks/attack_ssa_topk_mnist.py --error-feedback off --partitioning dirichlet

Prints a table; exit status 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "dpf-ssa-mnist"))
sys.path.insert(0, str(REPO))

from dpf_ssa_mnist import client_app as example  # noqa: E402
from dpf_ssa_mnist.task import Net  # noqa: E402
from flwr.app import ArrayRecord, Context, Message  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from flwr_fsl.core.records import decode_update  # noqa: E402
from flwr_fsl.crypto.channel import SealingKeyPair  # noqa: E402
from flwr_fsl.helper import InProcessHelper  # noqa: E402
from flwr_fsl.mods import ssa_mod, topk_mod  # noqa: E402
from flwr_fsl.strategies import SecureFedSubAvg  # noqa: E402
from flwr_fsl.submodel.layout import FlatLayout  # noqa: E402
from flwr_fsl.testing import InProcessGrid  # noqa: E402
from tests.attacks.solvers import least_squares_per_client  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--fraction-train", type=float, default=0.5)
    p.add_argument("--topk-ratio", type=float, default=0.1)
    p.add_argument("--error-feedback", choices=["on", "off"], default="on")
    p.add_argument("--partitioning", choices=["iid", "dirichlet"], default="dirichlet")
    p.add_argument("--max-client-samples", type=int, default=300)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the attack; print its figures."""
    args = parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    initial = ArrayRecord(Net().state_dict())
    model = {k: v.numpy() for k, v in initial.items()}
    layout = FlatLayout.of(model)
    chosen: dict[int, dict[int, np.ndarray]] = {}

    def spy(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train" and reply.has_content():
            rnd = int(msg.content["config"]["server-round"])
            received = {k: v.numpy() for k, v in msg.content["arrays"].items()}
            update = decode_update(reply.content, received, 1.0)
            chosen.setdefault(rnd, {})[context.node_id] = layout.elements(update).indices.copy()
        return reply

    app = ClientApp(mods=[ssa_mod, spy, topk_mod])
    app.train()(example.train)
    key = SealingKeyPair.generate()
    with tempfile.TemporaryDirectory() as tmp:
        run_config = {
            "ssa-helper-fingerprint": key.fingerprint,
            "topk-error-feedback": args.error_feedback == "on",
            "partitioning": args.partitioning,
            "max-client-samples": args.max_client_samples,
            "seed": args.seed,
            "results-dir": tmp,
        }
        grid = InProcessGrid(app, args.clients, run_config)
        strategy = SecureFedSubAvg(
            InProcessHelper(keypair=key),
            topk_ratio=args.topk_ratio,
            fraction_train=args.fraction_train,
            min_available_nodes=args.clients,
            sampling_seed=args.seed,
            max_abs=1e5,
        )
        rounds: list[Any] = []
        real = strategy.aggregation.lead.aggregate

        def record(params: Any, uploads: Any) -> Any:
            rounds.append(real(params, uploads))
            return rounds[-1]

        strategy.aggregation.lead.aggregate = record  # type: ignore[method-assign]
        started = time.perf_counter()
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=args.rounds)
        elapsed = time.perf_counter() - started

    nodes = list(grid.get_node_ids())
    index = {node: i for i, node in enumerate(nodes)}
    participation = np.zeros((len(rounds), len(nodes)))
    for r, outcome in enumerate(rounds):
        participation[r, [index[n] for n in outcome.accepted]] = 1
    counts = np.stack([np.asarray(o.result.counts, np.float64) for o in rounds])
    estimate = least_squares_per_client(participation, counts)

    frequency = np.zeros_like(estimate)  # truth: share of a client's rounds it chose j in
    for rnd in range(1, len(rounds) + 1):
        for node, indices in chosen[rnd].items():
            frequency[index[node], indices] += 1
    frequency /= np.maximum(participation.sum(0), 1)[:, None]
    truth = frequency > 0.5
    membership = float(np.mean((estimate > 0.5) == truth))
    rate = truth.mean(0)
    chance_membership = float(np.mean(np.maximum(rate, 1 - rate)))

    named = total = 0
    chance_named = 0.0
    for r, outcome in enumerate(rounds):
        members = [index[n] for n in outcome.accepted]
        for j in np.flatnonzero(np.rint(counts[r]) == 1):
            sole = [index[n] for n, idx in chosen[r + 1].items() if j in idx]
            guess = members[int(np.argmax(estimate[members, j]))]
            named += int(guess == sole[0])
            chance_named += 1 / len(members)
            total += 1
    stable = float(frequency[frequency > 0].mean())
    print(
        f"SSA top-k, MNIST CNN ({layout.size} coordinates, k = {args.topk_ratio:g}), "
        f"{args.clients} clients, {args.fraction_train:g} per round, {len(rounds)} rounds, "
        f"{args.partitioning}, error feedback {args.error_feedback}, unit weights, no DP "
        f"({elapsed:.0f} s)"
    )
    print(f"  mean choice frequency of a chosen coordinate: {stable:.3f}")
    print(
        f"  sole chooser named: {named}/{total} = {named / max(total, 1):.3f} "
        f"(chance {chance_named / max(total, 1):.3f})"
    )
    print(f"  membership: {membership:.3f} (best exchangeable guess {chance_membership:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
