"""``ssa_mod``: upload a (top-k) submodel update through two-server secure aggregation.

Stack it outside :func:`~flwr_fsl.mods.topk_mod`::

    app = ClientApp(mods=[ssa_mod, topk_mod])

When the train message carries SSA round parameters (sent by
:class:`~flwr_fsl.strategies.SecureFedSubAvg`), the mod takes the sparse update the inner mods
produced, numbers its coordinates in the model's flat index space, and replaces the reply's
arrays with DPF keys (:func:`flwr_fsl.protocols.ssa.encode_update`): the public part and S0's
master seed in the clear, S1's master seed sealed to S1's public key, which must match the
fingerprint pinned in the run config (:func:`flwr_fsl.pinning.pinned_fingerprint`:
``ssa-helper-fingerprint``, or in simulation S1's key file). The
metrics (with ``num-examples``, the count-weighting weight) are kept. Messages without SSA
parameters pass through untouched.
"""

from __future__ import annotations

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.pinning import pinned_fingerprint
from flwr_fsl.protocols.sealing import seal_ssa_upload
from flwr_fsl.protocols.ssa import encode_update
from flwr_fsl.records import SSA_UPLOAD_KEY, decode_update, find_ssa_round, ssa_upload_record
from flwr_fsl.submodel.layout import FlatLayout

WEIGHT_KEY = "num-examples"


def ssa_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client mod: turn the train reply into SSA DPF keys for the two servers.

    Parameters
    ----------
    msg : Message
        The incoming message; only ``train`` messages with SSA parameters are changed.
    context : Context
        The node's context (run config with the pinned helper key).
    call_next : ClientAppCallable
        The inner mods and the user's train function.

    Returns
    -------
    Message
        The reply carrying the SSA upload, or the inner reply unchanged.

    Raises
    ------
    ValueError
        If S1's key does not match the pinned fingerprint, the update selects more
        coordinates than the round allows, or values exceed the fixed-point range.
    """
    if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
        return call_next(msg, context)
    found = find_ssa_round(msg.content)
    if found is None:
        return call_next(msg, context)
    params, helper_key, binding = found
    verify_fingerprint(helper_key, pinned_fingerprint(context.run_config))
    records = msg.content.array_records
    if len(records) != 1:
        raise ValueError("ssa_mod expects one ArrayRecord (the model) in the train message")
    received = {k: v.numpy() for k, v in next(iter(records.values())).items()}
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    metrics = list(reply.content.metric_records.items())
    if len(metrics) != 1 or WEIGHT_KEY not in metrics[0][1]:
        raise ValueError(f"the train reply needs one MetricRecord with {WEIGHT_KEY!r}")
    weight = float(metrics[0][1][WEIGHT_KEY])  # type: ignore[arg-type]
    update = decode_update(reply.content, received, weight)
    layout = FlatLayout.of(received)
    if layout.size != params.domain_size:
        raise ValueError(f"model has {layout.size} coordinates, the round {params.domain_size}")
    indices, values = layout.flatten_update(update)
    if indices.size > params.num_items:
        raise ValueError(
            f"update touches {indices.size} coordinates but the round allows "
            f"{params.num_items}: stack topk_mod inside ssa_mod with the server's topk-count"
        )
    upload, _ = encode_update(params, indices, values.reshape(-1, 1), weight)
    sealed = seal_ssa_upload(
        helper_key,
        binding=binding,
        client_id=int(context.node_id),
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
    )
    content = RecordDict(
        {
            SSA_UPLOAD_KEY: ssa_upload_record(upload.public_part, upload.master_seeds[0], sealed),
            metrics[0][0]: metrics[0][1],
        }
    )
    return Message(content, reply_to=msg)


__all__ = ["ssa_mod"]
