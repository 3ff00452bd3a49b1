"""A curious server with sybils tries to isolate a victim in SecAgg+'s sparse mask graph (issue 26).

The server runs the real :class:`~flwr_fsl.families.secagg.protocol.SecAggServer` and controls
``S = 10`` sybil clients (real :class:`~flwr_fsl.families.secagg.protocol.SecAggClient`\\ s whose
keys and state it holds) among ``N = 30``; the 20 honest clients follow the protocol. The
mask graph is not the server's to choose: every client derives its ring order from the hash of
the roster (:mod:`flwr_fsl.families.secagg.graph`). The server's only lever is *grinding*:
after seeing the honest keys it draws fresh sybil keys until the hashed graph gives some
honest victim only sybil neighbours (``G = 200`` rosters tried). If it finds one, it runs the
round on that roster and reads the victim's input: ``y_v - PRG(b_v) - sum over its (sybil)
neighbours of their pair masks``, with ``b_v`` rebuilt from the Unmask shares it receives and
the pair masks from the sybils' own keys. Protocol level (the strategy on ``InProcessGrid`` has
no sybil hook); what it reads is the server's own state and its sybils'.

Success = the server recovers the victim's 8-word input exactly. Chance = guessing 8 uniform
64-bit words: ``2^-512`` (0 in any run).

- default (``neighbours=None``, the complete graph): no roster isolates anyone (a victim's
  neighbours include every honest client); the same read-out leaves the honest pair masks in:
  0 successes, at chance.
- ``neighbours = 10`` (``2 ceil(log2 30)``): one roster isolates some victim with probability
  at most ``20 C(10,10)/C(29,10) = 1e-6`` (:func:`~flwr_fsl.families.secagg.graph.grinding_bound`:
  ``2e-4`` over 200 tries): 0 successes expected; the test allows none.
- ``neighbours = 2`` (documented leak; :func:`check_neighbours` accepts it): one roster
  isolates a given victim with probability ``C(10,2)/C(29,2) = 0.11``, some victim ``~0.9``:
  the server finds an isolated victim within the first few tries and reads its input exactly.
"""

from __future__ import annotations

import os

import numpy as np

from flwr_fsl.families.secagg.graph import grinding_bound, isolation_probability
from flwr_fsl.families.secagg.masks import _shamir, _unlimbs, pair_mask, self_mask
from flwr_fsl.families.secagg.messages import _SEED_BYTES
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggParams, SecAggServer

U64 = np.uint64
HONEST = list(range(1, 21))
SYBILS = list(range(101, 111))
LENGTH = 8
TRIES = 200


def _grind(
    params: SecAggParams, honest: dict[int, SecAggClient]
) -> tuple[SecAggServer, dict[int, SecAggClient], int] | None:
    """Draw sybil keys until some honest client has only sybil neighbours (or give up)."""
    for _ in range(TRIES):
        sybils = {u: SecAggClient(u, params) for u in SYBILS}
        server = SecAggServer(params)
        for u, c in {**honest, **sybils}.items():
            server.add_advertisement(u, c.advertise())
        server.roster()
        for victim in HONEST:
            if server.graph[victim] <= set(SYBILS):
                return server, sybils, victim
    return None


def _read_victim(
    params: SecAggParams,
    server: SecAggServer,
    honest: dict[int, SecAggClient],
    sybils: dict[int, SecAggClient],
    inputs: dict[int, np.ndarray],
    victim: int,
) -> np.ndarray:
    """Run the round on the server's roster and strip the victim's masks it can compute."""
    everyone = {**honest, **sybils}
    roster = server.roster()
    for u, c in everyone.items():
        server.add_shares(u, c.share_keys(roster))
    u2 = server.sharers()
    masked = {}
    for u, c in everyone.items():
        masked[u] = c.masked_input(u2, inputs[u])
        server.add_masked_input(u, masked[u])
    for u, c in everyone.items():
        server.add_unmask(u, c.unmask(server.unmask_request(u)))
    order = sorted(server.graph)
    holders = server._shares[victim]  # what the victim's holders returned in Unmask
    parties = sorted(holders)
    secret = _shamir(params, len(order)).reconstruct(
        [order.index(p) for p in parties], [holders[p] for p in parties]
    )
    seed = _unlimbs(secret, _SEED_BYTES)  # a survivor's holders return b_v's shares only
    guess = masked[victim] - self_mask(params, seed)
    victim_public = honest[victim].s_key.public_bytes
    for s in set(SYBILS) & server.graph[victim]:
        mask = pair_mask(params, sybils[s].s_key.private_key, victim_public, min(s, victim),
                         max(s, victim))  # fmt: skip
        guess = guess - mask if victim < s else guess + mask
    return guess


def _attack(neighbours: int | None) -> tuple[int, int]:
    """Return (isolated rosters found, exact read-outs) for one run of the attack."""
    params = SecAggParams(1, os.urandom(16), 2, LENGTH, neighbours)
    rng = np.random.default_rng(7)
    inputs = {u: rng.integers(0, 2**63, LENGTH, dtype=U64) for u in HONEST + SYBILS}
    honest = {u: SecAggClient(u, params) for u in HONEST}
    found = _grind(params, honest)
    if found is None:
        # No isolation: still run the read-out against honest client 1 on an ordinary roster.
        sybils = {u: SecAggClient(u, params) for u in SYBILS}
        server = SecAggServer(params)
        for u, c in {**honest, **sybils}.items():
            server.add_advertisement(u, c.advertise())
        guess = _read_victim(params, server, honest, sybils, inputs, HONEST[0])
        return 0, int(np.array_equal(guess, inputs[HONEST[0]]))
    server, sybils, victim = found
    guess = _read_victim(params, server, honest, sybils, inputs, victim)
    return 1, int(np.array_equal(guess, inputs[victim]))


def test_default_complete_graph_cannot_be_ground_into_isolation() -> None:
    assert _attack(None) == (0, 0)


def test_suggested_neighbours_resist_two_hundred_rosters() -> None:
    assert grinding_bound(30, 10, 10, TRIES) < 1e-3
    assert _attack(10) == (0, 0)


def test_two_neighbours_leak_the_victims_input_to_a_grinding_server() -> None:
    assert isolation_probability(30, 2, 10) > 0.1
    assert _attack(2) == (1, 1)
