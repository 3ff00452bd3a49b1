"""``ssa_mod``: upload a (top-k) submodel update through two-server secure aggregation.

Stack it outside :func:`~flwr_fsl.mods.topk_mod`::

    app = ClientApp(mods=[ssa_mod, topk_mod])

When the train message carries SSA round parameters (sent by
:class:`~flwr_fsl.strategies.SecureFedSubAvg`), the mod takes the sparse update the inner mods
produced, numbers its coordinates in the model's flat index space, and replaces the reply's
arrays with DPF keys (:func:`flwr_fsl.families.ssa.protocol.encode_update`): the public part and
S0's master seed in the clear, S1's master seed sealed to S1's pinned key. Messages without SSA
parameters pass through untouched. The Flower plumbing is
:class:`~flwr_fsl.families.ssa.mod_base.ProtocolMod`'s (a
:class:`~flwr_fsl.core.phases.PhaseMod` with one phase,
:data:`~flwr_fsl.families.ssa.records.SSA_TRAIN`).

**Mega-elements.** A round that names ``topk-groups`` in its train config
(:class:`~flwr_fsl.strategies.SecureFedSubAvg` with ``groups``) numbers the update over a
:class:`~flwr_fsl.submodel.mega_layout.MegaLayout`: each chosen row of a grouped tensor is one
element (one DPF key of ``width + 1`` words), each chosen coordinate elsewhere one element
zero-padded to the same width. The layout's size and width must equal the round's.

**Weights.** Each coordinate's payload is ``(c * dw, c)``. By default (the strategy's
``weighted=False``) ``c = 1``: the count word S0 reconstructs is the number of clients that
chose the coordinate. In a weighted round ``c`` is the per-index count the reply carries for
that coordinate (a submodel update with ``counts``, as plaintext
:class:`~flwr_fsl.strategies.FedSubAvg` uses them), else the reply's ``num-examples`` (the
strategy's weight key, used only if it is ``num-examples`` or the node config allows it,
:meth:`~flwr_fsl.families.ssa.mod_base.ProtocolMod.check_weight_key`). The weight rides only
in the payload's count word: the secure reply carries no metrics in the clear.

In a round with distributed DP (the parameters carry a
:class:`~flwr_fsl.families.ssa.dp.DistributedDP`), the encoder clips the update to the round's
``clip_norm`` (L2 over all chosen coordinates) and the weight to ``max_weight`` before
encoding (:func:`~flwr_fsl.families.ssa.protocol.payload_words`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import Context, Message
from numpy.typing import NDArray

from flwr_fsl.core.checks import check_str
from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.records import decode_update
from flwr_fsl.families.ssa.mod_base import ProtocolMod
from flwr_fsl.families.ssa.protocol import encode_update
from flwr_fsl.families.ssa.records import SSA_TRAIN, RoundRequest, UploadReply
from flwr_fsl.submodel.layout import FlatLayout
from flwr_fsl.submodel.mega_layout import MegaLayout
from flwr_fsl.submodel.update import Encoding


class SSAMod(ProtocolMod):
    """Client mod: turn the train reply into SSA DPF keys for the two servers."""

    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {SSA_TRAIN.name: SSA_TRAIN}

    def on_train(
        self, request: RoundRequest, context: Context, train: Callable[[], Message]
    ) -> UploadReply | Message:
        """Train, then encode the (sparse) update as DPF keys over the flat model.

        With unit weights (the default) every coordinate's count word is 1; in a weighted
        round each coordinate is weighted by its per-index count when the reply carries
        counts, by the reply's weight (``num-examples``) otherwise: the same weights
        plaintext ``FedSubAvg`` averages by.

        Raises
        ------
        ValueError
            If the message has not one model ``ArrayRecord``, the model's element space is
            not the round's, the update uses row (mega-element) encoding in a round without
            ``topk-groups``, selects more elements than the round allows, or a weight or
            weighted value exceeds the fixed-point range.
        """
        params = request.round.params
        records = request.content.array_records
        if len(records) != 1:
            raise ClientInputError(
                "ssa_mod expects one ArrayRecord (the model) in the train message"
            )
        received = {k: v.numpy() for k, v in next(iter(records.values())).items()}
        self.check_weight_key(request, context)  # refuse before training
        reply = train()
        if reply.has_error():
            return reply
        weight = self.round_weight(request, reply, context)
        layout = round_layout(request, received)
        if layout.size != params.domain_size or layout.width != params.value_width:
            raise ClientInputError(  # both shapes are public
                f"the model's element space is {layout.size} x {layout.width}, the round's "
                f"{params.domain_size} x {params.value_width}"
            )
        update = decode_update(reply.content, received, weight)
        if not isinstance(layout, MegaLayout) and any(
            part.encoding is Encoding.ROWS for part in update.tensors.values()
        ):
            raise ConfigurationError(
                "row (mega-element) updates need the round's topk-groups (SecureFedSubAvg "
                "groups=...) or index mode"
            )
        # Per-index counts where the reply has them, its weight elsewhere (FedSubAvg's rule).
        elements = layout.elements(update)
        indices, values, counts = elements.indices, elements.values, elements.counts
        if indices.size > params.num_items:
            raise ConfigurationError(
                f"the update touches more coordinates than the round allows "
                f"(k={params.num_items}): stack topk_mod inside ssa_mod with the server's "
                "topk-count"
            )
        upload, _ = encode_update(params, indices, values, counts)
        # No metrics in the clear: the weight rides in the payload's count word only.
        return UploadReply(self.sealed_upload(upload, request.round, context))


def round_layout(
    request: RoundRequest, received: Mapping[str, NDArray[np.generic]]
) -> FlatLayout | MegaLayout:
    """Return the round's element space: mega-elements if the round names ``topk-groups``.

    The groups come from the train message's ``ConfigRecord`` (where
    :class:`~flwr_fsl.strategies.SecureFedSubAvg` puts them for ``topk_mod`` too); the run
    config's own ``topk-groups`` do not count, so a client never uses a layout the server
    did not announce.

    Raises
    ------
    ConfigurationError
        If ``topk-groups`` is malformed or names no floating tensor of the model.
    """
    names: list[str] = []
    for record in request.content.config_records.values():
        if "topk-groups" in record:
            raw = check_str("topk-groups", record["topk-groups"], empty=True)
            names = [g.strip() for g in raw.split(",") if g.strip()]
    return MegaLayout.of(received, names) if names else FlatLayout.of(received)


ssa_mod = SSAMod()
"""The mod instance to stack: ``ClientApp(mods=[ssa_mod, topk_mod])``."""

__all__ = ["SSAMod", "round_layout", "ssa_mod"]
