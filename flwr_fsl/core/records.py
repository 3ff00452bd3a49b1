"""The submodel codec in Flower records: what a client's sparse or dense reply looks like.

:func:`encode_update` puts a :class:`~flwr_fsl.submodel.update.SubmodelUpdate` into a
``RecordDict`` (the codec's header ``ConfigRecord`` and its ``ArrayRecord``,
:mod:`flwr_fsl.submodel.codec`); :func:`decode_update` reads a reply back against the global
model, raising :class:`~flwr_fsl.submodel.codec.SubmodelFormatError` on anything malformed.
Shared by every family whose clients send submodel updates (top-k, two-server SSA) and by the
families' own record readers (:func:`array_loader`, :data:`MAX_UPLOAD_BYTES`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from numpy.typing import NDArray

from flwr_fsl.submodel.codec import (
    ARRAYS_KEY,
    HEADER_KEY,
    SubmodelFormatError,
    decode_dense,
    decode_parts,
    encode_parts,
)
from flwr_fsl.submodel.update import SubmodelUpdate

__all__ = [
    "MAX_UPLOAD_BYTES",
    "array_loader",
    "bytes_field",
    "decode_update",
    "encode_update",
    "is_submodel_reply",
]

MAX_UPLOAD_BYTES = 1 << 30
"""Largest bytes field a record reader accepts from a client."""


def encode_update(update: SubmodelUpdate) -> RecordDict:
    """Encode a submodel update as the codec's two records (no metrics).

    Parameters
    ----------
    update : SubmodelUpdate
        The update (see :mod:`flwr_fsl.submodel.codec` for the format).

    Returns
    -------
    RecordDict
        ``{HEADER_KEY: ConfigRecord, ARRAYS_KEY: ArrayRecord}``.
    """
    header, arrays = encode_parts(update)
    return RecordDict(
        {
            HEADER_KEY: ConfigRecord(header),
            ARRAYS_KEY: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
        }
    )


def is_submodel_reply(content: RecordDict) -> bool:
    """Return True if ``content`` claims to be a submodel update (has the header record)."""
    return HEADER_KEY in content.config_records


def array_loader(record: ArrayRecord) -> Callable[[str], NDArray[np.generic]]:
    """Return a loader of ``record``'s arrays that turns any parse failure into a format error.

    Parameters
    ----------
    record : ArrayRecord
        A reply's array record.

    Returns
    -------
    Callable[[str], NDArray]
        ``load(key)``: the array (Flower loads ``.npy`` bytes with ``allow_pickle=False``); it
        raises :class:`~flwr_fsl.submodel.codec.SubmodelFormatError` if they do not parse.
    """

    def load(key: str) -> NDArray[np.generic]:
        try:
            return record[key].numpy()  # Flower loads .npy bytes with allow_pickle=False
        except Exception as exc:  # any failure to parse the bytes is a format error
            raise SubmodelFormatError(f"array {key!r} cannot be decoded: {exc}") from None

    return load


def decode_update(
    content: RecordDict, reference: Mapping[str, NDArray[np.generic]], weight: float
) -> SubmodelUpdate:
    """Decode and validate a train reply against the global model it answers.

    Parameters
    ----------
    content : RecordDict
        The reply's content: a submodel update or a plain dense reply (one ``ArrayRecord`` of
        full weights).
    reference : Mapping[str, numpy.ndarray]
        The global arrays the client received.
    weight : float
        The client's averaging weight (its sample count); finite and > 0.

    Returns
    -------
    SubmodelUpdate
        The validated update (dense replies become float64 deltas).

    Raises
    ------
    SubmodelFormatError
        If anything about the reply is malformed; the message names the offending part.
    """
    if is_submodel_reply(content):
        if ARRAYS_KEY not in content.array_records:
            raise SubmodelFormatError(f"missing ArrayRecord {ARRAYS_KEY!r}")
        record = content.array_records[ARRAYS_KEY]
        header = dict(content.config_records[HEADER_KEY])
        return decode_parts(header, array_loader(record), record.keys(), reference, weight)
    if len(content.array_records) != 1:
        raise SubmodelFormatError(
            f"a dense reply needs exactly one ArrayRecord, got {len(content.array_records)}"
        )
    record = next(iter(content.array_records.values()))
    return decode_dense(array_loader(record), record.keys(), reference, weight)


def bytes_field(content: RecordDict, key: str, field: str) -> bytes | None:
    """Return the bytes ``field`` of the ConfigRecord ``key`` in ``content``, if well formed.

    Parameters
    ----------
    content : RecordDict
        A message's content.
    key : str
        The family's record key (e.g. ``"fsl.secagg"``).
    field : str
        The field.

    Returns
    -------
    bytes or None
        The field; None when the record or the field is missing, is not bytes, or is over
        :data:`MAX_UPLOAD_BYTES` (the family raises its own error naming the field).
    """
    record = content.config_records.get(key)
    value = None if record is None else record.get(field)
    if not isinstance(value, bytes) or len(value) > MAX_UPLOAD_BYTES:
        return None
    return value
