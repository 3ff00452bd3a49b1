"""SecAgg's Flower records: the one record key and phase names both ends use.

Every SecAgg message is a ``train`` message (so it reaches the mods in front of the user's
``@app.train`` without another registered function) carrying one ConfigRecord under
:data:`SECAGG_KEY` with ``phase`` (one of :data:`SECAGG_PHASES`), ``params``
(``SecAggParams.to_bytes()``) and the phase's fields. The masked input goes back as one uint64
Array under :data:`SECAGG_KEY` in the reply's ArrayRecord, and nothing else.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.records import MAX_UPLOAD_BYTES, array_loader
from flwr_fsl.submodel.codec import SubmodelFormatError

__all__ = [
    "SECAGG_KEY",
    "SECAGG_PHASES",
    "masked_input_record",
    "read_masked_input",
    "read_secagg_bytes",
]

SECAGG_KEY = "fsl.secagg"
SECAGG_PHASES = ("advertise", "share", "train", "unmask")


def read_secagg_bytes(content: RecordDict, field: str) -> bytes:
    """Return the bytes ``field`` of the SecAgg ConfigRecord in ``content``.

    Raises
    ------
    SubmodelFormatError
        If the record or the field is missing or not bytes, or is over :data:`MAX_UPLOAD_BYTES`.
    """
    record = content.config_records.get(SECAGG_KEY)
    value = None if record is None else record.get(field)
    if not isinstance(value, bytes) or len(value) > MAX_UPLOAD_BYTES:
        raise SubmodelFormatError(f"SecAgg message lacks the bytes field {field!r}")
    return value


def read_masked_input(content: RecordDict, length: int) -> NDArray[np.uint64]:
    """Return the masked input of a SecAgg train reply (exactly ``length`` uint64 words).

    Raises
    ------
    SubmodelFormatError
        If the reply holds anything else, or the array has another dtype or shape.
    """
    if set(content.keys()) != {SECAGG_KEY} or SECAGG_KEY not in content.array_records:
        raise SubmodelFormatError("a SecAgg reply must hold only its masked input")
    record = content.array_records[SECAGG_KEY]
    if list(record.keys()) != ["masked"]:
        raise SubmodelFormatError("a SecAgg reply must hold only its masked input")
    array = record["masked"]
    # Checked before the bytes are parsed: nothing of another size is allocated.
    if array.dtype != "uint64" or tuple(array.shape) != (length,):
        raise SubmodelFormatError(f"the masked input must be {length} uint64 words")
    words = array_loader(record)("masked")
    if words.dtype != np.uint64 or words.shape != (length,):
        raise SubmodelFormatError(f"the masked input must be {length} uint64 words")
    return words.astype(np.uint64, copy=False)


def masked_input_record(masked: NDArray[np.uint64]) -> RecordDict:
    """Return the SecAgg train reply: the masked input only."""
    return RecordDict({SECAGG_KEY: ArrayRecord({"masked": Array(masked.astype(np.uint64))})})
