"""Wire format ``flwr_fsl.submodel`` v2: a subset of a model's coordinates, as plain numpy parts.

This module is Flower-free: it turns a :class:`SubmodelUpdate` into a *header* (a dict of
str/int/list values) and named *arrays* (numpy), and validates them back against the model.
:mod:`flwr_fsl.families.ssa.records` puts the parts into a Flower message — the header as a
``ConfigRecord``,
the arrays as an ``ArrayRecord`` — and takes them out again (it also reads plain dense replies).

A submodel reply carries two records next to the client's usual ``MetricRecord``:

``ConfigRecord`` under :data:`HEADER_KEY` (``"fsl.submodel"``)::

    format    = "flwr_fsl.submodel"
    version   = 1
    names     = [parameter names, in order]            (list[str])
    encodings = ["dense" | "coordinates" | "rows", ...] (list[str], same order)
    counts    = [True | False, ...]                     (list[bool], same order)

``ArrayRecord`` under :data:`ARRAYS_KEY` (``"fsl.update"``), for each listed parameter ``p``:

- dense: ``p|values`` — the full-shape delta, the parameter's dtype;
- coordinates: ``p|indices`` (flat row-major, unique, in range) and ``p|values``
  (1-D, the parameter's dtype, same length);
- rows (mega-elements): ``p|indices`` (indices along axis 0, unique, in range) and
  ``p|values`` of shape ``(len(indices), *shape[1:])``;
- and, when ``counts`` is True for ``p`` (coordinates/rows only), ``p|counts``: float64,
  finite and > 0, one per index.

Indices are ``uint32`` when every index is below 2^32 (so a top-k coordinate costs 8 bytes
with a float32 value), else ``uint64``. Values are deltas against the arrays the client
received. (Version 1 sent int64 indices; this is version 2.) Parameters not listed were not
touched. A reply without the header is a plain Flower reply: exactly one ``ArrayRecord`` of
full weights with the global model's shapes (every tensor or some; any real number dtype),
turned into dense deltas.
:func:`decode_parts` (and :func:`decode_dense` for a plain reply) check all of this and raise
:class:`SubmodelFormatError` (one error type, one reason string) on anything else; nothing is
unpickled (the Flower layer loads arrays with ``allow_pickle=False``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

FORMAT_NAME = "flwr_fsl.submodel"
FORMAT_VERSION = 2
HEADER_KEY = "fsl.submodel"
ARRAYS_KEY = "fsl.update"
_SEP = "|"


class SubmodelFormatError(ClientInputError):
    """A reply is not a valid submodel update; ``str(err)`` says why."""


def encode_parts(
    update: SubmodelUpdate,
) -> tuple[dict[str, Any], dict[str, NDArray[np.generic]]]:
    """Encode an update as the header and the arrays of the wire format (no metrics).

    Parameters
    ----------
    update : SubmodelUpdate
        The update; ``update.weight`` is not encoded (the client's ``MetricRecord`` carries
        its sample count).

    Returns
    -------
    tuple[dict, dict]
        The header fields and the named arrays (C-contiguous).
    """
    arrays: dict[str, NDArray[np.generic]] = {}
    names: list[str] = []
    encodings: list[str] = []
    has_counts: list[bool] = []
    for name, part in update.tensors.items():
        names.append(name)
        encodings.append(part.encoding.value)
        has_counts.append(part.counts is not None)
        arrays[f"{name}{_SEP}values"] = np.asarray(part.values, order="C")
        if part.indices is not None:
            arrays[f"{name}{_SEP}indices"] = _index_array(part.indices)
        if part.counts is not None:
            arrays[f"{name}{_SEP}counts"] = np.ascontiguousarray(part.counts, np.float64)
    header: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "names": names,
        "encodings": encodings,
        "counts": has_counts,
    }
    return header, arrays


def _check_weight(weight: float) -> None:
    if not (isinstance(weight, int | float) and math.isfinite(weight) and weight > 0):
        raise SubmodelFormatError(f"weight must be a finite number > 0, got {weight!r}")


def decode_parts(  # noqa: C901
    header: Mapping[str, Any],
    load: Callable[[str], NDArray[np.generic]],
    keys: Iterable[str],
    reference: Mapping[str, NDArray[np.generic]],
    weight: float,
) -> SubmodelUpdate:
    """Decode and validate a submodel update against the global model it answers.

    Parameters
    ----------
    header : Mapping[str, Any]
        The header fields (wire format above).
    load : Callable[[str], numpy.ndarray]
        Returns the array stored under a key (raising :class:`SubmodelFormatError` if it
        cannot be decoded); called only for keys the header makes necessary.
    keys : Iterable[str]
        Every array key present (extra keys are an error).
    reference : Mapping[str, numpy.ndarray]
        The global arrays the client received (names, shapes, dtypes, and the base of dense
        replies' deltas).
    weight : float
        The client's averaging weight (its sample count); must be finite and > 0.

    Returns
    -------
    SubmodelUpdate
        The validated update.

    Raises
    ------
    SubmodelFormatError
        If anything about the reply is malformed; the message names the offending part.
    """
    _check_weight(weight)
    if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
        raise SubmodelFormatError(
            f"unsupported submodel format {header.get('format')!r} "
            f"version {header.get('version')!r} (expected {FORMAT_NAME!r} v{FORMAT_VERSION})"
        )
    names, encodings, counts = (
        _str_or_bool_list(header, "names", str),
        _str_or_bool_list(header, "encodings", str),
        _str_or_bool_list(header, "counts", bool),
    )
    if not len(names) == len(encodings) == len(counts):
        raise SubmodelFormatError("header lists names/encodings/counts differ in length")
    if len(set(names)) != len(names):
        raise SubmodelFormatError("header lists a parameter more than once")
    present = set(keys)
    expected_keys: set[str] = set()
    tensors: dict[str, TensorUpdate] = {}
    for name, encoding_name, has_counts in zip(names, encodings, counts, strict=True):
        if name not in reference:
            raise SubmodelFormatError(f"unknown parameter {name!r}")
        try:
            encoding = Encoding(encoding_name)
        except ValueError:
            raise SubmodelFormatError(f"{name}: unknown encoding {encoding_name!r}") from None
        ref = np.asarray(reference[name])
        keys = [f"{name}{_SEP}values"]
        if encoding is not Encoding.DENSE:
            keys.append(f"{name}{_SEP}indices")
        if has_counts:
            if encoding is Encoding.DENSE:
                raise SubmodelFormatError(f"{name}: counts are not allowed on a dense tensor")
            keys.append(f"{name}{_SEP}counts")
        for key in keys:
            if key not in present:
                raise SubmodelFormatError(f"{name}: missing array {key!r}")
        expected_keys.update(keys)
        arrays = {key.rsplit(_SEP, 1)[1]: load(key) for key in keys}
        tensors[name] = _validate_tensor(name, encoding, ref, arrays)
    extra = present - expected_keys
    if extra:
        raise SubmodelFormatError(f"unexpected arrays {sorted(extra)}")
    return SubmodelUpdate(tensors, float(weight))


def _str_or_bool_list(header: Mapping[str, Any], key: str, kind: type) -> list[Any]:
    value = header.get(key)
    if not isinstance(value, list) or not all(type(v) is kind for v in value):
        raise SubmodelFormatError(f"header field {key!r} must be a list of {kind.__name__}")
    return value


def _check_values(name: str, values: NDArray[np.generic], ref: NDArray[np.generic]) -> None:
    if values.dtype != ref.dtype:
        raise SubmodelFormatError(f"{name}: dtype {values.dtype} != model dtype {ref.dtype}")
    if np.issubdtype(values.dtype, np.inexact) and not np.all(np.isfinite(values)):
        raise SubmodelFormatError(f"{name}: values contain NaN or inf")


def _check_dense_values(name: str, values: NDArray[np.generic], ref: NDArray[np.generic]) -> None:
    """Check a dense reply's tensor: any real number dtype for a numeric tensor, as FedAvg.

    Flower's ``FedAvg`` averages a float64 reply into a float32 model (and the reverse); so does
    a dense reply here. Sparse parts keep the strict check (:func:`_check_values`).
    """
    numeric = (np.integer, np.floating)
    if values.dtype == ref.dtype:
        _check_values(name, values, ref)
        return
    if (
        not (
            any(np.issubdtype(values.dtype, k) for k in numeric)
            and any(np.issubdtype(ref.dtype, k) for k in numeric)
        )
        or values.dtype == np.bool_
    ):
        raise SubmodelFormatError(f"{name}: dtype {values.dtype} != model dtype {ref.dtype}")
    if np.issubdtype(values.dtype, np.inexact) and not np.all(np.isfinite(values)):
        raise SubmodelFormatError(f"{name}: values contain NaN or inf")


def _index_array(indices: NDArray[np.int64]) -> NDArray[np.unsignedinteger]:
    idx = np.asarray(indices)
    if idx.size and int(idx.min()) < 0:
        raise ConfigurationError("indices must be non-negative")
    small = not idx.size or int(idx.max()) < 2**32
    return np.ascontiguousarray(idx, np.uint32 if small else np.uint64)


def _check_indices(name: str, indices: NDArray[np.generic], bound: int) -> NDArray[np.int64]:
    if indices.dtype not in (np.uint32, np.uint64) or indices.ndim != 1:
        raise SubmodelFormatError(
            f"{name}: indices must be 1-D uint32 or uint64, got {indices.dtype} with shape "
            f"{indices.shape}"
        )
    if indices.size and int(indices.max()) >= bound:
        raise SubmodelFormatError(f"{name}: index out of range [0, {bound})")
    if np.unique(indices).size != indices.size:
        raise SubmodelFormatError(f"{name}: duplicate indices")
    return indices.astype(np.int64, copy=False)


def _validate_tensor(
    name: str,
    encoding: Encoding,
    ref: NDArray[np.generic],
    arrays: dict[str, NDArray[np.generic]],
) -> TensorUpdate:
    values = arrays["values"]
    _check_values(name, values, ref)
    if encoding is Encoding.DENSE:
        if values.shape != ref.shape:
            raise SubmodelFormatError(f"{name}: shape {values.shape} != model shape {ref.shape}")
        return TensorUpdate(encoding, values)
    if encoding is Encoding.COORDINATES:
        indices = _check_indices(name, arrays["indices"], ref.size)
        if values.shape != indices.shape:
            raise SubmodelFormatError(
                f"{name}: {values.shape[0] if values.ndim else 0} values for "
                f"{indices.size} indices (values must be 1-D, one per index)"
            )
    else:
        if ref.ndim < 1:
            raise SubmodelFormatError(f"{name}: rows encoding needs a tensor with a row axis")
        indices = _check_indices(name, arrays["indices"], ref.shape[0])
        expected = (indices.size, *ref.shape[1:])
        if values.shape != expected:
            raise SubmodelFormatError(f"{name}: rows shape {values.shape} != {expected}")
    counts: NDArray[np.float64] | None = None
    if "counts" in arrays:
        raw = arrays["counts"]
        # Check the dtype before any conversion: strings or objects must not reach astype.
        if raw.dtype != np.float64 or raw.shape != indices.shape:
            raise SubmodelFormatError(
                f"{name}: counts must be float64 with one entry per index, got "
                f"{raw.dtype} {raw.shape}"
            )
        counts = raw.astype(np.float64, copy=False)
        if not np.all(np.isfinite(counts)) or np.any(counts <= 0):
            raise SubmodelFormatError(f"{name}: counts must be finite and > 0")
    return TensorUpdate(encoding, values, indices, counts)


def decode_dense(
    load: Callable[[str], NDArray[np.generic]],
    keys: Iterable[str],
    reference: Mapping[str, NDArray[np.generic]],
    weight: float,
) -> SubmodelUpdate:
    """Decode a plain dense reply (full weights, some or all of the model's keys) into deltas.

    Parameters
    ----------
    load : Callable[[str], numpy.ndarray]
        Returns the weights stored under a parameter name.
    keys : Iterable[str]
        The parameter names present; they must equal the model's.
    reference : Mapping[str, numpy.ndarray]
        The global arrays the client received.
    weight : float
        The client's averaging weight; finite and > 0.

    Returns
    -------
    SubmodelUpdate
        One dense part per parameter.

    Raises
    ------
    SubmodelFormatError
        If the reply holds no tensor of the model or one it does not have, a shape differs
        from the model's, a dtype is not a real number type, or values are not finite. A
        tensor the reply leaves out is not updated by this client (not counted for it); a
        float64 reply to a float32 tensor (or the reverse) is averaged as FedAvg does.
    """
    _check_weight(weight)
    present = set(keys)
    extra = present - set(reference)
    if extra or not present:
        raise SubmodelFormatError(
            f"dense reply keys differ from the model: missing {sorted(set(reference))}, "
            f"unknown {sorted(extra)}"
            if not present
            else f"dense reply keys differ from the model: unknown {sorted(extra)}"
        )
    tensors: dict[str, TensorUpdate] = {}
    for name, ref in reference.items():
        if name not in present:
            continue  # not updated by this client: its coordinates are not counted (FedAvg's
            # replies must agree on keys; a submodel reply may leave a tensor out)
        ref = np.asarray(ref)
        values = load(name)
        _check_dense_values(name, values, ref)
        if values.shape != ref.shape:
            raise SubmodelFormatError(f"{name}: shape {values.shape} != model shape {ref.shape}")
        # Deltas in float64 so that averaging dense replies reproduces FedAvg closely.
        delta = values.astype(np.float64) - ref.astype(np.float64)
        tensors[name] = TensorUpdate(Encoding.DENSE, delta)
    return SubmodelUpdate(tensors, float(weight))
