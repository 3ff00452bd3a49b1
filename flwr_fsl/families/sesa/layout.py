"""Which model coordinates form SESA's shards: groups of equal-length shard vectors per layer.

Flower-free; built on the width-extraction layer structure
(:class:`~flwr_fsl.families.width.spec.WidthSpec`,
:func:`~flwr_fsl.families.width.rules.shard_channels`)
and the platform's flat layout and count-weighted apply. Every hidden ("scaled") layer of
width ``K_l`` is split into ``S = 1 / B_min`` shards of ``K_l / S`` consecutive channels; a
client of capacity ``B`` picks ``B · S`` of them per hidden layer (uniformly, secretly:
:func:`~flwr_fsl.families.width.rules.select_shards` with the OS's randomness) and trains the
narrow model those channels span (:meth:`SesaLayout.width_layout`). Each floating coordinate
of the model belongs to exactly one *group* (a :class:`~flwr_fsl.families.sesa.messages.SesaGroup`
of the round), by the hidden layers whose channels index it:

=========  ==================================================  ========  =====================
group      coordinates                                         shards    a client's slots
=========  ==================================================  ========  =====================
``node``   hidden layer ``h``'s rows whose inputs are not       ``S``     its ``B·S`` shards
           sharded (the first layer), ``h``'s bias and          of ``h``
           per-channel extras (batch norm), and the next
           layer's columns from ``h`` when that layer's
           outputs are not sharded (the classifier)
``pair``   layer ``l``'s weight block between shard ``a`` of    ``S²``    ``(B·S)²`` pairs
           its outputs and shard ``b`` of the previous hidden             ``a·S + b``
           layer's (Sami & Güler's submodel: the connections
           between two shards of consecutive layers)
``common`` everything else: tensors every client holds          1         ``(0,)``
           (the classifier's bias, unsharded layers)
=========  ==================================================  ========  =====================

For the MLP 784-200-10 with ``S = 4`` this is one ``node`` group of 4 shards of
``50 · 784 + 50 + 10 · 50 = 39,750`` coordinates (a hidden node's input weights, bias and
output weights) and a ``common`` group of the 10 output biases; a CNN's second conv layer is a
``pair`` group of ``S²`` blocks. Shards of one group have equal lengths (every hidden width
must be a multiple of ``S``). Coordinates are global flat indices
(:class:`~flwr_fsl.submodel.layout.FlatLayout` of the floating tensors; integer buffers are
not aggregated), ascending within a shard.

Each group travels as :class:`~flwr_fsl.families.sesa.messages.ShardVector` s (the shard's values
plus a count word); :meth:`SesaLayout.apply` turns the decoded per-shard sums into the new
model with :func:`~flwr_fsl.submodel.aggregate.apply_count_weighted` — a coordinate moves by
``Σ c·Δ / Σ c`` over the clients whose shard held it, and shards nobody chose stay.

Descriptors (:attr:`ShardGroup.descriptor`: ``"node:fc1"``, ``"pair:conv2/conv1"``,
``"common"``) name the groups on the wire so a client checks that the server's round has the
layout it derives from the model it receives.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.sesa.messages import SesaGroup
from flwr_fsl.families.width.rules import shard_channels, shards_for_rate
from flwr_fsl.families.width.spec import WidthSpec
from flwr_fsl.submodel.aggregate import apply_count_weighted
from flwr_fsl.submodel.layout import FlatLayout, WidthLayout

__all__ = ["SesaLayout", "ShardGroup", "check_selection", "group_slots"]

GroupKind = Literal["node", "pair", "common"]


@dataclass(frozen=True, eq=False)
class ShardGroup:
    """One group of equal-length shards and the global coordinates each holds.

    Attributes
    ----------
    kind : {"node", "pair", "common"}
        See the module docstring.
    layers : tuple[str, ...]
        ``(h,)`` for a node group, ``(l, p)`` (outputs, inputs) for a pair group, ``()``.
    coords : numpy.ndarray
        ``(K, m)`` int64 global flat coordinates of each shard, ascending per row.
    """

    kind: GroupKind
    layers: tuple[str, ...]
    coords: NDArray[np.int64]

    @property
    def shards(self) -> int:
        """``K`` of the group."""
        return int(self.coords.shape[0])

    @property
    def length(self) -> int:
        """Coordinates per shard."""
        return int(self.coords.shape[1])

    @property
    def descriptor(self) -> str:
        """``"node:<h>"``, ``"pair:<l>/<p>"`` or ``"common"``."""
        return self.kind if self.kind == "common" else f"{self.kind}:{'/'.join(self.layers)}"


def _block(
    shape: tuple[int, ...], rows: NDArray[np.int64] | None, cols: NDArray[np.int64] | None
) -> NDArray[np.int64]:
    """Row-major positions in a tensor of ``shape`` of ``W[rows][:, cols]`` (None: all)."""
    axes = [np.arange(d, dtype=np.int64) for d in shape]
    if rows is not None:
        axes[0] = rows
    if cols is not None:
        axes[1] = cols
    return np.asarray(np.ravel_multi_index(np.ix_(*axes), shape), np.int64).reshape(-1)


def check_selection(
    selection: Mapping[str, Sequence[int]], layers: Sequence[str], num_shards: int
) -> dict[str, list[int]]:
    """Validate a per-hidden-layer shard choice (the same number of shards in every layer).

    Parameters
    ----------
    selection : Mapping[str, sequence of int]
        Hidden layer -> chosen shard ids.
    layers : sequence of str
        The hidden layers.
    num_shards : int
        ``S``.

    Returns
    -------
    dict[str, list[int]]
        The choice, in the order of ``layers``.

    Raises
    ------
    ClientInputError
        If a hidden layer is missing or extra, or a choice is empty, out of range, repeated,
        not increasing, or its size differs between layers.
    """
    if set(selection) != set(layers):
        raise ClientInputError("a shard choice must name exactly the hidden layers")
    out: dict[str, list[int]] = {}
    sizes = set()
    for name in layers:
        ids = [int(x) for x in selection[name]]
        if not ids or any(not 0 <= x < num_shards for x in ids):
            raise ClientInputError(f"{name}: shard ids must lie in [0, {num_shards})")
        if any(b <= a for a, b in itertools.pairwise(ids)):
            raise ClientInputError(f"{name}: shard ids must be strictly increasing")
        sizes.add(len(ids))
        out[name] = ids
    if len(sizes) > 1:
        raise ClientInputError("a client picks the same number of shards in every layer")
    return out


def group_slots(
    descriptors: Sequence[str], num_shards: int, selection: Mapping[str, Sequence[int]]
) -> tuple[tuple[int, ...], ...]:
    """Per group (by descriptor), the shard ids a per-layer choice holds: the SESA slots.

    ``node:h`` -> the shards chosen in ``h``; ``pair:l/p`` -> ``a·S + b`` for every chosen
    ``a`` of ``l`` and ``b`` of ``p``; ``common`` -> ``(0,)``. Increasing in each group.

    Raises
    ------
    ClientInputError
        If a descriptor is malformed or names a layer the choice does not have.
    """
    out: list[tuple[int, ...]] = []
    for text in descriptors:
        kind, _, rest = str(text).partition(":")
        names = rest.split("/") if rest else []
        if any(n not in selection for n in names):
            raise ClientInputError(f"group {text!r} names a layer that is not hidden")
        if kind == "node" and len(names) == 1:
            out.append(tuple(sorted(int(a) for a in selection[names[0]])))
        elif kind == "pair" and len(names) == 2:
            a_ids, b_ids = selection[names[0]], selection[names[1]]
            out.append(tuple(sorted(int(a) * num_shards + int(b) for a in a_ids for b in b_ids)))
        elif kind == "common" and not names:
            out.append((0,))
        else:
            raise ClientInputError(f"malformed SESA group descriptor {text!r}")
    return tuple(out)


@dataclass(frozen=True, eq=False)
class SesaLayout:
    """A model's SESA shard groups (module docstring). Build it with :meth:`of`.

    Attributes
    ----------
    spec : WidthSpec
        The layer structure.
    num_shards : int
        ``S``.
    flat : FlatLayout
        The global model's flat layout of floating tensors.
    widths : dict[str, int]
        Hidden layer -> global width.
    groups : tuple[ShardGroup, ...]
        The groups, in a fixed order (node and pair groups in layer order, common last).
    """

    spec: WidthSpec
    num_shards: int
    flat: FlatLayout
    widths: dict[str, int]
    groups: tuple[ShardGroup, ...]

    @classmethod
    def of(  # noqa: C901, PLR0915
        cls,
        arrays: Mapping[str, NDArray[np.generic]],
        num_shards: int,
        spec: WidthSpec | None = None,
    ) -> SesaLayout:
        """Derive the groups of a model.

        Parameters
        ----------
        arrays : Mapping[str, numpy.ndarray]
            The global model (tensors in forward order, e.g. a ``state_dict``).
        num_shards : int
            ``S = 1 / B_min`` (>= 1); every hidden width must be a multiple of it.
        spec : WidthSpec, optional
            The layer structure (default :meth:`WidthSpec.sequential` of ``arrays``).

        Raises
        ------
        ConfigurationError
            If ``S`` is invalid, the structure does not fit the model, or a hidden width is
            not a multiple of ``S``.
        """
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ConfigurationError(f"num_shards must be an int >= 1, got {num_shards!r}")
        s = num_shards
        try:
            spec = spec if spec is not None else WidthSpec.sequential(arrays)
            widths = spec.widths(arrays)
        except ConfigurationError as err:
            raise ConfigurationError(f"SESA layout: {err}") from err
        for name, width in widths.items():
            if width % s:
                raise ConfigurationError(
                    f"SESA layout: hidden layer {name!r} has width {width}, not a multiple of "
                    f"num_shards = {s}"
                )
        flat = FlatLayout.of(arrays)
        floating = set(flat.names)
        node: dict[str, list[list[NDArray[np.int64]]]] = {h: [[] for _ in range(s)] for h in widths}
        pairs: list[tuple[str, str, list[NDArray[np.int64]]]] = []
        taken = np.zeros(flat.size, dtype=bool)

        def channels(layer: str, shard: int, group: int = 1) -> NDArray[np.int64]:
            ch = shard_channels(widths[layer], s, [shard])
            return (ch[:, None] * group + np.arange(group, dtype=np.int64)).reshape(-1)

        def add(target: list[NDArray[np.int64]], name: str, rows: object, cols: object) -> None:
            if name not in floating:
                return
            shape = flat.shapes[flat.names.index(name)]
            pos = _block(shape, rows, cols) + flat.offset(name)  # type: ignore[arg-type]
            target.append(pos)
            taken[pos] = True

        previous: str | None = None
        for layer in spec.layers:
            prev = previous if previous is not None and previous in widths else None
            g = layer.in_group
            vectors = layer.tensors[1:]
            if layer.scaled and prev is None:
                for a in range(s):
                    rows = channels(layer.name, a)
                    add(node[layer.name][a], layer.weight, rows, None)
            elif layer.scaled and prev is not None:
                blocks: list[NDArray[np.int64]] = []
                for a in range(s):
                    for b in range(s):
                        part: list[NDArray[np.int64]] = []
                        add(part, layer.weight, channels(layer.name, a), channels(prev, b, g))
                        blocks.append(np.concatenate(part) if part else np.zeros(0, np.int64))
                pairs.append((layer.name, prev, blocks))
            elif prev is not None:
                for b in range(s):
                    add(node[prev][b], layer.weight, None, channels(prev, b, g))
            if layer.scaled:
                for a in range(s):
                    for t in vectors:
                        add(node[layer.name][a], t, channels(layer.name, a), None)
            previous = layer.name
        groups: list[ShardGroup] = []
        for h in widths:
            parts = [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in node[h]]
            if parts[0].size:
                groups.append(ShardGroup("node", (h,), np.stack(parts)))
        for name, prev_name, blocks in pairs:
            if blocks[0].size:
                stacked = np.stack([np.sort(b) for b in blocks])
                groups.append(ShardGroup("pair", (name, prev_name), stacked))
        rest = np.flatnonzero(~taken).astype(np.int64)
        if rest.size:
            groups.append(ShardGroup("common", (), rest[None, :]))
        for group in groups:
            group.coords.flags.writeable = False
        return cls(spec, s, flat, widths, tuple(groups))

    @property
    def descriptors(self) -> tuple[str, ...]:
        """Every group's :attr:`ShardGroup.descriptor`, in order."""
        return tuple(g.descriptor for g in self.groups)

    def sesa_groups(self, extra_words: int = 1) -> tuple[SesaGroup, ...]:
        """Return the round's groups: ``K`` and ``m + extra_words`` (the count word) each."""
        return tuple(SesaGroup(g.shards, g.length + extra_words) for g in self.groups)

    def shards_per_layer(self, rate: float) -> int:
        """``B · S``: shards a client of capacity ``rate`` picks in every hidden layer.

        Raises
        ------
        ClientInputError
            If ``rate · S`` is not a whole number in ``[1, S]``.
        """
        try:
            return shards_for_rate(rate, self.num_shards)
        except ValueError as err:
            raise ClientInputError(f"capacity: {err}") from err

    def check_selection(self, selection: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """Validate a per-hidden-layer shard choice (:func:`check_selection`)."""
        return check_selection(selection, tuple(self.widths), self.num_shards)

    def slots(self, selection: Mapping[str, Sequence[int]]) -> tuple[tuple[int, ...], ...]:
        """Per group, the shard ids a choice holds (:func:`group_slots`)."""
        return group_slots(self.descriptors, self.num_shards, self.check_selection(selection))

    def channels(self, selection: Mapping[str, Sequence[int]]) -> dict[str, NDArray[np.int64]]:
        """Hidden layer -> the channels of its chosen shards (ascending)."""
        chosen = self.check_selection(selection)
        return {
            name: shard_channels(self.widths[name], self.num_shards, ids)
            for name, ids in chosen.items()
        }

    def width_layout(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        selection: Mapping[str, Sequence[int]],
    ) -> WidthLayout:
        """Return the :class:`~flwr_fsl.submodel.layout.WidthLayout` of a choice's narrow model.

        Raises
        ------
        ClientInputError
            If the choice is invalid.
        ValueError
            If ``arrays`` is not the model the layout was built from.
        """
        return self.spec.layout(arrays, self.channels(selection))

    def shard_deltas(
        self,
        global_arrays: Mapping[str, NDArray[np.generic]],
        trained: Mapping[str, NDArray[np.generic]],
        selection: Mapping[str, Sequence[int]],
    ) -> list[NDArray[np.float64]]:
        """Per group, the ``(K_i, m)`` deltas ``trained - global`` of the chosen shards.

        Parameters
        ----------
        global_arrays : Mapping[str, numpy.ndarray]
            The global model the client received.
        trained : Mapping[str, numpy.ndarray]
            Its trained narrow model (the shapes of :meth:`width_layout`'s ``sub_shapes``).
        selection : Mapping[str, sequence of int]
            Its shard choice.

        Raises
        ------
        ClientInputError
            If the trained model's tensors are missing, unknown, misshapen or not finite.
        """
        layout = self.width_layout(global_arrays, selection)
        update = layout.delta(global_arrays, trained)
        idx, values = layout.scatter({n: t.values for n, t in update.tensors.items()})
        full = np.zeros(self.flat.size, dtype=np.float64)
        held = np.zeros(self.flat.size, dtype=bool)
        full[idx] = values
        held[idx] = True
        out = []
        for g, ids in zip(self.groups, self.slots(selection), strict=True):
            block = g.coords[list(ids)]
            if not held[block].all():  # by construction; guards against a layout mismatch
                raise ValueError(f"the narrow model does not hold group {g.descriptor}")
            out.append(full[block])
        return out

    def apply(
        self,
        global_arrays: Mapping[str, NDArray[np.generic]],
        sums: Sequence[ArrayLike],
        weights: Sequence[ArrayLike],
    ) -> dict[str, NDArray[np.generic]]:
        """Return the new model from per-group sums ``Σ c·Δ`` ``(K, m)`` and weights ``Σ c``.

        Each shard's coordinates move by ``Σ c·Δ / Σ c`` (the platform's count-weighted
        apply); shards with no weight keep their values; integer buffers are unchanged.

        Raises
        ------
        ConfigurationError
            If the shapes do not match the groups.
        RoundFailedError
            If a sum or weight is not finite.
        """
        if len(sums) != len(self.groups) or len(weights) != len(self.groups):
            raise ConfigurationError("one sum and one weight block per group are needed")
        flat_sums = np.zeros((self.flat.size, 1), dtype=np.float64)
        counts = np.zeros(self.flat.size, dtype=np.float64)
        for g, total, weight in zip(self.groups, sums, weights, strict=True):
            t = np.asarray(total, dtype=np.float64)
            w = np.asarray(weight, dtype=np.float64)
            if t.shape != g.coords.shape or w.shape != (g.shards,):
                raise ConfigurationError(f"group {g.descriptor}: sums {t.shape}, weights {w.shape}")
            flat_sums[g.coords.reshape(-1), 0] = t.reshape(-1)
            counts[g.coords.reshape(-1)] = np.repeat(w, g.length)
        return apply_count_weighted(global_arrays, self.flat, flat_sums, counts)
