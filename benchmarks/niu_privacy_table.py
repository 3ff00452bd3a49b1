"""Niu et al. Table V from the code: the randomized-response choices and their privacy levels.

Run ``python benchmarks/niu_privacy_table.py [--clients N] [--rounds R] [--seed S] [--json PATH]``.
For the five choices of probability parameters (CPP1..CPP5, ``p1 = p3``, ``p2 = p4``) it prints,
from :class:`flwr_fsl.families.sfsl.perturb.RRParams`:

* ``p5``, ``p6`` (Pr[an index is kept | it is / is not real]) and ``ε1``, ``ε∞`` (Lemmas 1-2),
  which depend on the parameters only and must equal the paper's table (they bound the
  perturbed sets only, not the aggregates: ``docs/families/sfsl.md``);
* Theorem 2's ``p7`` and ``p8``, which depend on how many chosen clients have each index: the
  paper averages them over the indices of 100 Taobao users' union, which is not public. Here the
  same average is taken over ``--clients`` MovieLens-100k users drawn at random (real index set
  = the movies a user rated), so these two columns are ours, printed beside the paper's;
* a measured check of ``p5``/``p6``: the rates at which :func:`perturb_index_set` actually keeps
  real and non-real indices over ``--rounds`` fresh clients' first rounds.

Writes the rows as JSON (default ``benchmarks/results/niu_privacy_table.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np

from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.data import load_movielens
from flwr_fsl.families.sfsl.perturb import (
    PermanentMemo,
    RRParams,
    perturb_index_set,
    theorem2_events,
)

CHOICES = {
    "CPP1": (1.0, 0.0),
    "CPP2": (15 / 16, 1 / 16),
    "CPP3": (7 / 8, 1 / 8),
    "CPP4": (3 / 4, 1 / 4),
    "CPP5": (1.0, 1.0),
}
# The paper's Table V (p5, p6 and p7, p8 in %, eps1, eps_inf).
PAPER = {
    "CPP1": (100.0, 0.0, math.inf, math.inf, 86.7, 0.0),
    "CPP2": (88.3, 11.7, 2.02, 2.71, 0.0, 10.3),
    "CPP3": (78.1, 21.9, 1.27, 1.95, 0.0, 19.5),
    "CPP4": (62.5, 37.5, 0.51, 1.10, 0.0, 34.2),
    "CPP5": (100.0, 100.0, 0.0, 0.0, 0.0, 0.0),
}


def _eps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"


def main() -> None:
    """Print Table V and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="chosen clients (100)")
    parser.add_argument("--rounds", type=int, default=20, help="fresh clients measured (20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="benchmarks/results/niu_privacy_table.json")
    args = parser.parse_args()

    data = load_movielens()
    rng = np.random.default_rng(args.seed)
    users = rng.choice(data.num_users, size=args.clients, replace=False)
    sets = [np.unique(data.item_ids[data.user_ids == u]) for u in users]
    union = np.unique(np.concatenate(sets))
    n1 = np.zeros(data.num_items, dtype=np.int64)
    for s in sets:
        n1[s] += 1
    owners = n1[union]
    others = args.clients - owners
    print(
        f"MovieLens-100k: {args.clients} users (seed {args.seed}), union of their rated movies "
        f"|U| = {union.size}; {np.mean(owners == 1):.1%} of U rated by one user only"
    )
    header = (
        f"{'CPP':<5} {'p1,p3':>7} {'p2,p4':>7} {'p5':>7} {'p6':>7} {'eps1':>6} {'eps_inf':>7} "
        f"{'p7 ours':>8} {'p8 ours':>8} | {'paper p5/p6':>12} {'eps1/eps_inf':>13} "
        f"{'p7/p8':>11} | {'measured p5/p6':>15}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    prg = PRGStream(os.urandom(16))
    for name, (keep, flip) in CHOICES.items():
        params = RRParams.symmetric(keep, flip)
        p7, p8 = theorem2_events(params, owners, others)
        kept_real = kept_other = total_real = total_other = 0
        for k in range(args.rounds):
            real = sets[k % len(sets)]
            out, _ = perturb_index_set(real, union, PermanentMemo(), params, prg)
            inside = np.isin(out, real)
            kept_real += int(inside.sum())
            kept_other += int((~inside).sum())
            total_real += real.size
            total_other += union.size - real.size
        measured = (kept_real / total_real, kept_other / total_other)
        paper = PAPER[name]
        row = {
            "cpp": name,
            "p1": keep,
            "p2": flip,
            "p5": params.p5,
            "p6": params.p6,
            "eps1": params.epsilon_one_round,
            "eps_inf": params.epsilon_permanent,
            "p7": float(p7.mean()),
            "p8": float(p8.mean()),
            "measured_p5": measured[0],
            "measured_p6": measured[1],
            "paper": paper,
        }
        rows.append(row)
        print(
            f"{name:<5} {keep:>7.4f} {flip:>7.4f} {params.p5:>7.1%} {params.p6:>7.1%} "
            f"{_eps(params.epsilon_one_round):>6} {_eps(params.epsilon_permanent):>7} "
            f"{row['p7']:>8.1%} {row['p8']:>8.1%} | "
            f"{f'{paper[0]:.1f}/{paper[1]:.1f}':>12} "
            f"{f'{_eps(paper[2])}/{_eps(paper[3])}':>13} "
            f"{f'{paper[4]:.1f}/{paper[5]:.1f}':>11} | "
            f"{f'{measured[0]:.1%}/{measured[1]:.1%}':>15}"
        )
    exact = all(
        round(r["p5"] * 100, 1) == r["paper"][0]
        and round(r["p6"] * 100, 1) == r["paper"][1]
        and _eps(r["eps1"]) == _eps(r["paper"][2])
        and _eps(r["eps_inf"]) == _eps(r["paper"][3])
        for r in rows
    )
    print(f"p5, p6 (to 0.1%) and eps1, eps_inf (to 2 decimals) equal the paper's: {exact}")
    print(
        "eps1 and eps_inf bound what the perturbed sets S'' reveal (eps_inf: over the rounds "
        "of one memo), not the rows round's exact per-row sums, which over rounds with changing "
        "participants decode the real sets at any CPP (tests/attacks/test_sfsl_*); "
        "SFSLFedSubAvg's default adds distributed DP (docs/families/sfsl.md)"
    )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"clients": args.clients, "union": int(union.size), "rows": rows}))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
