"""One strict-decoder check for every binary format: truncation, trailing bytes, magic, version,
random corruptions.

:func:`check_strict_decoder` takes a well-formed sample and its decoder and checks that

* every truncation (each prefix of length ``0 .. len - 1``) raises the expected error class;
* one trailing byte raises it;
* a bad magic (one byte changed at ``magic_offset``) raises it;
* a bad version (the byte at ``version_offset`` changed) raises it, when the format has one;
* random single-byte corruptions either raise the expected error class or decode: never any
  other exception (no ``IndexError``, ``struct.error``, ``MemoryError``, ``OverflowError`` or
  a ``ValueError`` that is not a :class:`~flwr_fsl.core.errors.ClientInputError`).

It returns nothing and raises one :class:`AssertionError` listing every failure (case, input
description, exception), so a test shows all findings of a format at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flwr_fsl.core.errors import ClientInputError

__all__ = ["check_strict_decoder", "strict_decoder_findings"]


def _outcome(decode: Callable[[bytes], Any], data: bytes, error: type[Exception]) -> str | None:
    """None when ``decode`` raised ``error``; else what it did instead."""
    try:
        decode(data)
    except error:
        return None
    except Exception as err:  # the point: any other exception type is a finding
        return f"raised {type(err).__name__}: {err}"
    return "decoded"


def strict_decoder_findings(
    sample: bytes,
    decode: Callable[[bytes], Any],
    *,
    magic_offset: int | None = 0,
    version_offset: int | None = 4,
    error: type[Exception] = ClientInputError,
    corruptions: int = 64,
    seed: int = 0,
) -> list[str]:
    """Return every failure of the checks of the module docstring (empty when strict).

    Parameters
    ----------
    sample : bytes
        A well-formed encoding (``decode(sample)`` must succeed).
    decode : callable
        The strict decoder under test.
    magic_offset : int or None, optional
        Where the 4-byte magic starts (None: the format has no magic).
    version_offset : int or None, optional
        Where the version byte is (None: no version byte).
    error : type, optional
        The error class every malformed input must raise (a ``ClientInputError`` subclass).
    corruptions : int, optional
        How many random single-byte corruptions to try.
    seed : int, optional
        Seed of the corruption positions and values.
    """
    if not issubclass(error, ClientInputError):
        raise TypeError(f"{error.__name__} is not a ClientInputError")
    findings = []
    try:
        decode(sample)
    except Exception as err:
        return [f"the sample does not decode: {type(err).__name__}: {err}"]
    for n in range(len(sample)):
        what = _outcome(decode, sample[:n], error)
        if what is not None:
            findings.append(f"truncated to {n} of {len(sample)} bytes: {what}")
    for extra in (b"\x00", b"\xff" * 9):
        what = _outcome(decode, sample + extra, error)
        if what is not None:
            findings.append(f"{len(extra)} trailing byte(s): {what}")
    for name, offset in (("magic", magic_offset), ("version", version_offset)):
        if offset is None:
            continue
        bad = bytearray(sample)
        bad[offset] ^= 0x5A
        what = _outcome(decode, bytes(bad), error)
        if what is not None:
            findings.append(f"bad {name} (byte {offset} changed): {what}")
    rng = np.random.default_rng(seed)
    for _ in range(corruptions if sample else 0):
        at = int(rng.integers(len(sample)))
        value = int(rng.integers(256))
        if value == sample[at]:
            value ^= 0xFF
        bad = bytearray(sample)
        bad[at] = value
        what = _outcome(decode, bytes(bad), error)
        if what is not None and what != "decoded":
            findings.append(f"byte {at} set to {value:#04x}: {what}")
    return findings


def check_strict_decoder(sample: bytes, decode: Callable[[bytes], Any], **kwargs: Any) -> None:
    """Assert :func:`strict_decoder_findings` finds nothing (same arguments)."""
    findings = strict_decoder_findings(sample, decode, **kwargs)
    assert not findings, "decoder is not strict:\n" + "\n".join(findings)
