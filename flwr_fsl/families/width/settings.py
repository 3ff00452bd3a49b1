"""The width family's Flower-free message formats: the one typed, versioned settings record.

A width ``train`` message carries, beside the user's model and config records, the client's
:class:`~flwr_fsl.families.width.rules.WidthAssignment` (``FSLW``, per client) and the round's
:class:`WidthSettings` (``settings`` field of the width ConfigRecord): which of the message's
ConfigRecords is the train config the mod writes ``width-rate`` into. The strategy builds and
validates the settings once (:class:`~flwr_fsl.core.errors.ConfigurationError`); the client
decodes them strictly (:class:`~flwr_fsl.core.wireformat.WireFormatError`, a
:class:`~flwr_fsl.core.errors.ClientInputError`).

**Format** (little-endian, through :mod:`flwr_fsl.core.wireformat`): ``b"FSWS"``, version
``u8`` (1), ``config_key`` (UTF-8 bytes, length-prefixed); nothing after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic

__all__ = ["SETTINGS_MAGIC", "SETTINGS_VERSION", "WidthSettings"]

SETTINGS_MAGIC = register_magic(b"FSWS", "width settings (flwr_fsl.families.width.settings)")
"""First bytes of an encoded :class:`WidthSettings`."""
SETTINGS_VERSION = 1
"""The settings format's version."""
MAX_KEY_BYTES = 1024
"""Longest record key (UTF-8 bytes); Flower's keys are far shorter."""


def check_key(value: object, what: str) -> str:
    """Return ``value`` if it is a non-empty record key of at most :data:`MAX_KEY_BYTES`.

    Raises
    ------
    ConfigurationError
        Otherwise, naming ``what``.
    """
    if not isinstance(value, str) or not value or len(value.encode()) > MAX_KEY_BYTES:
        raise ConfigurationError(f"{what} must be a non-empty record key, got {value!r}")
    return value


def read_text(reader: Reader, what: str, family: str) -> str:
    """Read one length-prefixed UTF-8 key (at most :data:`MAX_KEY_BYTES`).

    Raises
    ------
    WireFormatError
        If it is truncated, too long or not UTF-8.
    """
    raw = reader.raw(what)
    if len(raw) > MAX_KEY_BYTES:
        raise WireFormatError(f"{family} settings: {what} is too long")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireFormatError(f"{family} settings: {what} is not UTF-8") from err


@dataclass(frozen=True)
class WidthSettings:
    """What a width round's clients need besides their assignment (module docstring).

    Parameters
    ----------
    config_key : str
        The message's train ConfigRecord (``configrecord_key``), where the mod sets
        ``width-rate``.

    Raises
    ------
    ConfigurationError
        If ``config_key`` is not a non-empty key.
    """

    config_key: str = "config"

    def __post_init__(self) -> None:
        check_key(self.config_key, "configrecord_key")

    def to_bytes(self) -> bytes:
        """Return the versioned record (module docstring)."""
        w = Writer()
        w.fixed(SETTINGS_MAGIC, len(SETTINGS_MAGIC))
        w.u8(SETTINGS_VERSION)
        w.raw(self.config_key.encode())
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> WidthSettings:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        WireFormatError
            If the bytes are truncated, have trailing bytes, another magic or version, or a
            key that is empty, too long or not UTF-8.
        """
        r = Reader.versioned(data, SETTINGS_MAGIC, SETTINGS_VERSION, "width settings")
        key = read_text(r, "config key", "width")
        r.done()
        try:
            return cls(key)
        except ConfigurationError as err:
            raise WireFormatError(f"invalid width settings: {err}") from err
