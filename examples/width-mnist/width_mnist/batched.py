"""width-mnist: the plaintext twin of the MLP arms, every sampled client trained in one batch.

Sami & Güler's accuracy figures come from hundreds of rounds at 100 users (their notebooks
divide the learning rate every round after round 500). Through Flower, one round of this
app runs 90 ClientApps one after another: too slow on two cores for more than a few dozen
rounds. This module trains the *same* clients on the *same* data with the *same* rule in one
batched computation, so the long runs fit on this machine:

- **training**: the sampled clients of one capacity group train their narrow MLPs
  (``784 -> k -> 10``, HeteroFL's scaler dividing the hidden activations by the rate) side by
  side as a batch of models: ``torch.bmm`` over stacked weights, one Adam over the stacked
  tensors (Adam is elementwise, so it is one fresh Adam per client), batch order from
  :func:`torch.randperm` with each client's own seed
  (:func:`width_mnist.client_app.train_seed`), as :func:`width_mnist.task.train` draws it;
- **extraction**: the index sets come from the library
  (:class:`flwr_fsl.families.width.rules.WidthRule`
  for rolling / static / random / server-drawn shards; for ``sesa`` each client draws its
  shards with :func:`~flwr_fsl.families.width.rules.select_shards` from its own stream, as
  ``sesa_mod`` does from the operating system's);
- **aggregation**: the library's own code. Width arms: each client's
  :meth:`~flwr_fsl.submodel.layout.WidthLayout.delta` accumulated and applied with
  :func:`~flwr_fsl.submodel.aggregate.apply_count_weighted`, as
  :class:`~flwr_fsl.strategies.WidthFedAvg` does. SESA: each client's clipped shard deltas are
  encoded with :class:`~flwr_fsl.families.sesa.mod.ShardVector` (stochastic fixed point in
  ``F_p``), summed in ``F_p`` and decoded and applied as
  :class:`~flwr_fsl.strategies.SesaFedAvg` does. The Lagrange coding is left out: its decoded
  result *is* that ``F_p`` sum (exact, ``tests/families/sesa/test_protocol.py``), and the example's
  test checks the Flower SESA arm against the same plaintext average.

``tests/examples/test_width_example.py`` checks a round of this twin against the Flower arms
(``WidthFedAvg`` / ``SesaFedAvg`` with the example's ``ClientApp`` on the in-process grid)
for the same clients. Clients are sampled per round (``fraction-train``) with
``default_rng([seed, round])``, the same clients for every arm.

Only the MLP is batched (``model = "mlp"``); every client must hold the same number of
samples (600 under the paper's split).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn import functional as F

from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.ring import PrimeField
from flwr_fsl.families.sesa.layout import SesaLayout
from flwr_fsl.families.sesa.mod import ShardVector
from flwr_fsl.families.width.rules import CapacityMix, WidthRule, WidthSpec, select_shards
from flwr_fsl.submodel.aggregate import accumulate_elements, apply_count_weighted
from width_mnist.client_app import train_seed
from width_mnist.server_app import EXTRACTION
from width_mnist.task import Settings, build_model, client_data, initial_state, test_data
from width_mnist.task import test as test_fn

__all__ = [
    "BATCHED_ARMS",
    "BatchedArm",
    "BatchedRun",
    "Data",
    "evaluate_model",
    "run_batched",
    "sampled_clients",
    "train_group",
]

BATCHED_ARMS = ("full", "fedrolex", "heterofl", "random", "shards", "sesa")
# The arms' extraction rules, as the Flower arms use them ("full": everyone at rate 1).
_RULES = {"full": "static", **EXTRACTION}
_HIDDEN, _HEAD = "blocks.0.layer", "head"
_TAG_SESA_CHOICE = 0x5E5A


Model = dict[str, NDArray[np.float32]]
Choice = Mapping[str, Any]
"""A client's choice: hidden layer -> channels (width arms) or shard ids (SESA)."""


@dataclass
class BatchedRun:
    """Accuracy curves of every arm (percent, ``None`` in rounds not evaluated)."""

    curves: dict[str, list[float | None]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    models: dict[str, Model] = field(default_factory=dict)


def sampled_clients(settings: Settings, num_clients: int, server_round: int) -> list[int]:
    """Return the partitions sampled in a round: ``round(fraction-train * N)`` of them."""
    count = max(settings.min_nodes, round(settings.fraction_train * num_clients))
    count = min(count, num_clients)
    rng = np.random.default_rng([settings.seed, server_round])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def train_group(
    model: Mapping[str, NDArray[np.floating]],
    hidden: Sequence[NDArray[np.int64]],
    rate: float,
    xs: torch.Tensor,
    ys: torch.Tensor,
    seeds: Sequence[int],
    settings: Settings,
) -> list[Model]:
    """Train one capacity group's narrow MLPs side by side; return each trained slice.

    Parameters
    ----------
    model : Mapping[str, numpy.ndarray]
        The global MLP (``blocks.0.layer.*``, ``head.*``).
    hidden : sequence of numpy.ndarray
        Per client, its kept hidden channels (all of one length ``k``).
    rate : float
        The group's rate (the scaler divides hidden activations by it).
    xs, ys : torch.Tensor
        ``(n, samples, 784)`` images and ``(n, samples)`` labels of the group's clients.
    seeds : sequence of int
        Each client's training seed (its batch order).
    settings : Settings
        Learning rate, batch size and epochs.

    Returns
    -------
    list[dict[str, numpy.ndarray]]
        Per client, its trained narrow model (the keys and shapes of ``build_model(rate)``).
    """
    idx = torch.as_tensor(np.stack(hidden), dtype=torch.long)  # (n, k)
    w1 = torch.as_tensor(np.asarray(model[f"{_HIDDEN}.weight"]))[idx].clone()  # (n, k, 784)
    b1 = torch.as_tensor(np.asarray(model[f"{_HIDDEN}.bias"]))[idx].clone()  # (n, k)
    head_w = torch.as_tensor(np.asarray(model[f"{_HEAD}.weight"]))  # (10, K)
    w2 = head_w[:, idx].permute(1, 0, 2).contiguous()  # (n, 10, k)
    b2 = torch.as_tensor(np.asarray(model[f"{_HEAD}.bias"])).expand(len(hidden), -1).clone()
    params = [p.requires_grad_() for p in (w1, b1, w2, b2)]
    optimizer = torch.optim.Adam(params, lr=settings.lr, foreach=True)
    n, samples = ys.shape
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    scale = 1.0 / rate if rate != 1.0 else 1.0
    rows = torch.arange(n)[:, None]
    for _ in range(settings.local_epochs):
        order = torch.stack([torch.randperm(samples, generator=g) for g in generators])
        for start in range(0, samples, settings.batch_size):
            batch = order[:, start : start + settings.batch_size]
            x, y = xs[rows, batch], ys[rows, batch]  # (n, b, 784), (n, b)
            optimizer.zero_grad(set_to_none=False)  # no fresh allocation per step
            h = F.relu(torch.baddbmm(b1[:, None, :], x, w1.transpose(1, 2)) * scale)
            logits = torch.baddbmm(b2[:, None, :], h, w2.transpose(1, 2))
            # Sum of per-client batch means: each client's gradient is its own.
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="none").reshape(n, -1).mean(dim=1).sum()  # fmt: skip
            loss.backward()
            optimizer.step()
    out = []
    for c in range(n):
        out.append(
            {
                f"{_HIDDEN}.weight": w1[c].detach().numpy().copy(),
                f"{_HIDDEN}.bias": b1[c].detach().numpy().copy(),
                f"{_HEAD}.weight": w2[c].detach().numpy().copy(),
                f"{_HEAD}.bias": b2[c].detach().numpy().copy(),
            }
        )
    return out


class BatchedArm:
    """One arm's global model and its rounds (extraction, batched training, aggregation).

    Parameters
    ----------
    name : str
        The arm (:data:`BATCHED_ARMS`).
    settings : Settings
        The app's settings.
    model : dict[str, numpy.ndarray]
        The initial global MLP.
    rates : sequence of float
        Each partition's capacity (``full`` trains everyone at 1).
    client_key : callable, optional
        Partition -> the client id the random and shard streams are keyed by (the node id
        in Flower; the partition id by default).
    chunk : int
        Most clients trained in one batch (small batches stay in cache).
    secure : bool
        ``sesa`` only: aggregate through the real SESA protocol
        (:func:`flwr_fsl.families.sesa.server.run_round`: keys, sealed Lagrange evaluations,
        masked updates, ``ψ`` and decoding, in process, ``T`` = ``sesa-privacy`` of the
        clients) instead of the twin's plain ``F_p`` sum. Same shard choices and training;
        the sums decode to the same value up to the fixed point's stochastic rounding.
    """

    def __init__(
        self,
        name: str,
        settings: Settings,
        model: Model,
        rates: Sequence[float],
        client_key: Callable[[int], int] | None = None,
        chunk: int = 8,
        secure: bool = False,
    ) -> None:
        if name not in BATCHED_ARMS:
            raise ValueError(f"arm must be one of {BATCHED_ARMS}, got {name!r}")
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        self.name = name
        self.secure = secure and name == "sesa"
        self.settings = settings
        self.model = model
        self.rates = list(rates) if name != "full" else [1.0] * len(rates)
        self.client_key = client_key or (lambda c: c)
        self.chunk = chunk
        self.spec = WidthSpec.sequential(model)
        self.widths = self.spec.widths(model)
        (self.hidden_name,) = self.widths
        self.layout = SesaLayout.of(model, settings.num_shards)
        self.codec = FixedPoint(
            settings.sesa_frac_bits, max(settings.sesa_clip, 1.0), settings.sesa_max_clients,
            PrimeField(),
        )  # fmt: skip
        self.rng = np.random.default_rng([settings.seed, _TAG_SESA_CHOICE])
        self.rule: WidthRule | None = None  # SESA's clients draw their own shards
        if name in _RULES:
            rule = _RULES[name]
            shards = settings.num_shards if rule == "shards" else None
            self.rule = WidthRule(rule, num_shards=shards, seed=settings.seed)

    def choices(self, server_round: int, clients: Sequence[int]) -> dict[int, Choice]:
        """Per client, its channels (width arms) or its secretly drawn shard choice (SESA)."""
        out: dict[int, Choice] = {}
        for c in clients:
            rate, key = self.rates[c], self.client_key(c)
            if self.name == "sesa":
                rng = np.random.default_rng(
                    [self.settings.seed, _TAG_SESA_CHOICE, server_round, key]
                )
                width = self.widths[self.hidden_name]
                sel = select_shards(width, self.settings.num_shards, rate, rng)
                out[c] = {self.hidden_name: [int(s) for s in sel.shards]}
            else:
                assert self.rule is not None
                out[c] = self.rule.indices(self.widths, rate, server_round, key)
        return out

    def hidden(self, choice: Choice) -> NDArray[np.int64]:
        """Return the hidden channels of a client's choice, in its narrow model's order."""
        if self.name == "sesa":
            return self.layout.channels(choice)[self.hidden_name]
        return np.asarray(choice[self.hidden_name])

    def train(
        self, server_round: int, clients: Sequence[int], choices: Mapping[int, Choice], data: Data
    ) -> dict[int, Model]:
        """Train every client's narrow model (batched by rate, ``chunk`` at a time)."""
        trained: dict[int, Model] = {}
        for rate in sorted({self.rates[c] for c in clients}, reverse=True):
            group = [c for c in clients if self.rates[c] == rate]
            for start in range(0, len(group), self.chunk):
                part = group[start : start + self.chunk]
                seeds = [train_seed(self.settings, server_round, c) for c in part]
                rows = torch.as_tensor(part)
                out = train_group(self.model, [self.hidden(choices[c]) for c in part], rate,
                                  data.x[rows], data.y[rows], seeds, self.settings)  # fmt: skip
                trained.update(zip(part, out, strict=True))
        return {c: trained[c] for c in clients}

    def aggregate(self, choices: Mapping[int, Choice], trained: Mapping[int, Model]) -> None:
        """Replace the global model by the round's count-weighted average (library code)."""
        model = self.model
        if self.name == "sesa":
            field_ = self.codec.ring
            totals = [np.zeros((g.shards, g.length + 1), dtype=np.uint64)
                      for g in self.layout.groups]  # fmt: skip
            clip = self.settings.sesa_clip
            for c, sub in trained.items():
                choice = choices[c]
                deltas = self.layout.shard_deltas(model, sub, choice)
                for g, ids, d, total in zip(self.layout.groups, self.layout.slots(choice),
                                            deltas, totals, strict=True):  # fmt: skip
                    words = ShardVector(g.length, self.codec).encode(
                        np.clip(d, -clip, clip), 1.0, self.rng
                    )
                    total[list(ids)] = field_.add(total[list(ids)], words)
            sums, weights = [], []
            for g, total in zip(self.layout.groups, totals, strict=True):
                values = self.codec.decode(total)
                weight = values[:, g.length]
                weight[weight < 0.5 / self.codec.scale] = 0.0
                sums.append(values[:, : g.length])
                weights.append(weight)
            new = self.layout.apply(model, sums, weights)
        else:
            layouts = {c: self.spec.layout(model, choices[c]) for c in trained}
            size = next(iter(layouts.values())).size
            total_sums, counts = np.zeros((size, 1)), np.zeros(size)
            for c, sub in trained.items():
                part = layouts[c].elements(layouts[c].delta(model, sub, 1.0))
                s, n = accumulate_elements(size, 1, [part])
                total_sums += s
                counts += n
            new = apply_count_weighted(model, layouts[next(iter(trained))], total_sums, counts)
        self.model = {k: np.asarray(v, dtype=np.float32) for k, v in new.items()}

    def round(
        self,
        server_round: int,
        clients: Sequence[int],
        data: Data,
        choices: Mapping[int, Choice] | None = None,
    ) -> None:
        """Run one round with ``clients`` (``choices`` overrides the drawn ones, for tests)."""
        chosen = dict(choices) if choices is not None else self.choices(server_round, clients)
        trained = self.train(server_round, clients, chosen, data)
        if self.secure and choices is None:
            self.secure_aggregate(server_round, trained)
        else:
            self.aggregate(chosen, trained)

    def secure_aggregate(self, server_round: int, trained: Mapping[int, Model]) -> None:
        """Replace the global model through one real SESA round over ``trained``'s clients.

        Each client is a :class:`~flwr_fsl.families.sesa.server.SesaParty` whose shard draw
        uses the stream :meth:`choices` used (so it picks the shards it trained) and whose
        ``train`` returns its trained narrow model.
        """
        from flwr_fsl.families.sesa.server import SesaParty, run_round
        from flwr_fsl.families.sesa.settings import SesaSettings

        parties = {}
        for c, sub in trained.items():
            key = self.client_key(c)
            rng = np.random.default_rng([self.settings.seed, _TAG_SESA_CHOICE, server_round, key])
            parties[c + 1] = SesaParty(
                c + 1, self.rates[c], lambda _narrow, sub=sub: (dict(sub), 1.0), rng
            )
        settings = SesaSettings(
            num_shards=self.settings.num_shards,
            clip=self.settings.sesa_clip,
            frac_bits=self.settings.sesa_frac_bits,
            max_clients=self.settings.sesa_max_clients,
        )
        privacy = self.settings.privacy
        t = max(1, int(privacy * len(parties))) if isinstance(privacy, float) else privacy
        result = run_round(self.model, parties, settings, server_round=server_round, privacy=t)
        self.model = {k: np.asarray(v, dtype=np.float32) for k, v in result.model.items()}


@dataclass
class Data:
    """Every partition's training data, stacked."""

    x: torch.Tensor  # (N, samples, 784)
    y: torch.Tensor  # (N, samples)

    @classmethod
    def load(cls, settings: Settings, num_clients: int) -> Data:
        """Load the partitions of :func:`width_mnist.task.client_data` (equal sizes needed).

        Raises
        ------
        ValueError
            If the partitions differ in size.
        """
        parts = [client_data(settings, c, num_clients) for c in range(num_clients)]
        sizes = {len(y) for _, y in parts}
        if len(sizes) != 1:
            raise ValueError(f"the batched twin needs equal partition sizes, got {sorted(sizes)}")
        x = np.stack([np.asarray(x, dtype=np.float32).reshape(len(x), -1) for x, _ in parts])
        y = np.stack([np.asarray(y, dtype=np.int64) for _, y in parts])
        return cls(torch.as_tensor(x), torch.as_tensor(y))


def evaluate_model(settings: Settings, model: Model) -> float:
    """Return the full-width model's test accuracy in percent."""
    x_test, y_test = test_data(settings.dataset, settings.test_size)
    net = build_model("mlp")
    net.load_state_dict({k: torch.as_tensor(v) for k, v in model.items()})
    return 100.0 * test_fn(net, x_test, y_test)[1]


def run_batched(
    settings: Settings,
    num_clients: int,
    arms: Sequence[str],
    eval_every: int = 1,
    progress: Callable[[int, BatchedRun], None] | None = None,
    chunk: int = 8,
    secure_sesa: bool = False,
) -> BatchedRun:
    """Run every arm for ``settings.num_server_rounds`` rounds; return their accuracy curves.

    Rounds are the outer loop (every arm does round ``r`` before any does ``r + 1``), so a
    run cut short still has comparable curves.

    Parameters
    ----------
    settings : Settings
        The app's settings (``model`` must be ``"mlp"``).
    num_clients : int
        ``N`` (the population; ``fraction-train`` of it is sampled each round).
    arms : sequence of str
        Arms among :data:`BATCHED_ARMS`.
    eval_every : int
        Evaluate the global models every ``eval_every`` rounds (and after the last).
    progress : callable, optional
        Called with ``(round, run so far)`` after every evaluation (e.g. to save it).
    chunk : int
        Most clients trained in one batch.
    secure_sesa : bool
        Run the ``sesa`` arm's aggregation through the real SESA protocol
        (:meth:`BatchedArm.secure_aggregate`) instead of the plain ``F_p`` sum.

    Returns
    -------
    BatchedRun
        Curves (percent), seconds per arm and final models.

    Raises
    ------
    ValueError
        If the model is not the MLP, an arm is unknown or ``eval_every < 1``.
    """
    if settings.model != "mlp":
        raise ValueError("the batched twin covers the MLP only (model = 'mlp')")
    unknown = [a for a in arms if a not in BATCHED_ARMS]
    if unknown or not arms or len(set(arms)) != len(arms):
        raise ValueError(f"arms must be distinct names among {BATCHED_ARMS}, got {list(arms)}")
    if eval_every < 1:
        raise ValueError("eval_every must be >= 1")
    data = Data.load(settings, num_clients)
    rates = CapacityMix.parse(settings.width_mix).fixed(num_clients)
    initial = {k: v.numpy().astype(np.float32)
               for k, v in initial_state("mlp", settings.seed).items()}  # fmt: skip
    runners = [BatchedArm(a, settings, {k: v.copy() for k, v in initial.items()}, rates,
                          chunk=chunk, secure=secure_sesa) for a in arms]  # fmt: skip
    result = BatchedRun(curves={a: [] for a in arms}, seconds=dict.fromkeys(arms, 0.0), models={})
    rounds = settings.num_server_rounds
    for rnd in range(1, rounds + 1):
        clients = sampled_clients(settings, num_clients, rnd)
        evaluate = rnd % eval_every == 0 or rnd == rounds
        for arm in runners:
            started = time.perf_counter()
            arm.round(rnd, clients, data)
            result.seconds[arm.name] += time.perf_counter() - started
            accuracy = evaluate_model(settings, arm.model) if evaluate else None
            if accuracy is not None and not math.isfinite(accuracy):
                raise ValueError(f"arm {arm.name} diverged in round {rnd}")
            result.curves[arm.name].append(accuracy)
            result.models[arm.name] = arm.model
        if evaluate and progress is not None:
            progress(rnd, result)
    return result
