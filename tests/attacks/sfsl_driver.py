"""The SFSL attacks' Flower-free twin: the family's round server with the server's exact view.

Used where a test needs a round the strategy does not run — every row released every round
(the union step skipped), to show that the rows round's noise alone defeats an attack. The
clients are :class:`~flwr_fsl.families.sfsl.server.SFSLParty` objects with the same rows and
updates as :mod:`tests.attacks.sfsl_setup`'s ClientApp; the server is
:class:`~flwr_fsl.families.sfsl.server.SFSLServer` at the strategy's default settings; the
record is the same :class:`~tests.attacks.sfsl_setup.ServerView`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.exchange import Exchange, local_exchange
from flwr_fsl.families.secagg.protocol import SecAggParams
from flwr_fsl.families.sfsl.dp import SFSLDP
from flwr_fsl.families.sfsl.messages import SFSLSettings
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.families.sfsl.psu import PSUParams, UnionReport
from flwr_fsl.families.sfsl.server import SFSLParty, SFSLResult, SFSLServer, psu_params
from tests.attacks import sfsl_setup as sfsl


class _AllRowsServer(SFSLServer):
    """The round server with the union step replaced by "every table row"."""

    def union(
        self, exchange: Exchange, nodes: Sequence[int], params: SecAggParams, settings: SFSLSettings
    ) -> tuple[NDArray[np.int64], UnionReport, list[int]]:
        rows = np.arange(sfsl.ROWS, dtype=np.int64)
        return rows, UnionReport(rows.size, rows.size, 0.0, 0.0, rows.size), list(nodes)


def _party(pid: int, rr: RRParams) -> SFSLParty:
    held = np.flatnonzero(sfsl.truth()[pid]).astype(np.int64)

    def train(model: dict[str, NDArray[np.generic]]) -> tuple[dict[str, NDArray], float]:
        out = {k: np.array(v, copy=True) for k, v in model.items()}
        for r in held:
            out["emb"][r] += sfsl.delta(pid, int(r))
        out["fc"] += np.float32(0.01)
        return out, 10.0

    return SFSLParty(1000 + pid, held, np.ones(held.size), rr, train)


def drive(rr: RRParams, rounds: int, *, union: str = "all") -> sfsl.ServerView:
    """Run ``rounds`` rounds of 3 random clients of 5 at the strategy's default DP settings.

    ``union="all"`` releases every row every round (:class:`_AllRowsServer`).
    """
    settings = SFSLSettings("emb", weighted=False, dp=SFSLDP())
    server = _AllRowsServer(settings) if union == "all" else SFSLServer(settings)
    parties = {1000 + p: _party(p, rr) for p in range(sfsl.CLIENTS)}
    model = {
        "emb": np.zeros((sfsl.ROWS, sfsl.WIDTH), np.float32),
        "fc": np.zeros(2, np.float32),
    }
    psu: PSUParams = psu_params(sfsl.ROWS)
    rng = np.random.default_rng(11)
    view = sfsl.ServerView()
    for server_round in range(1, rounds + 1):
        chosen = sorted(int(n) for n in rng.choice(list(parties), sfsl.PER_ROUND, replace=False))
        exchange = local_exchange({n: parties[n] for n in chosen}, {})
        result: SFSLResult = server.run(exchange, model, chosen, server_round, 2, psu)
        view.results.append(result)
        model = result.model
    return view
