"""Typed client state: one protocol object per ``Context.state`` slot, kept with its own codec.

A slot stores the protocol's versioned bytes in a ``ConfigRecord``; a slot that does not decode
reads as empty (the protocol starts afresh), so a corrupted or old-format slot never fails a client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from flwr.app import ConfigRecord, Context

from flwr_fsl.core.errors import ClientInputError

__all__ = ["StateSlot"]

T = TypeVar("T")
_SLOT_FIELD = "bytes"


@dataclass(frozen=True)
class StateSlot(Generic[T]):
    """One typed value in ``Context.state``: its codec's bytes in a ``ConfigRecord``.

    Parameters
    ----------
    name : str
        The ``Context.state`` key (e.g. ``"fsl.ssa.client-state"``).
    to_bytes : Callable[[T], bytes]
        The value's encoder.
    from_bytes : Callable[[bytes], T]
        The strict decoder; it raises a :class:`~flwr_fsl.core.errors.ClientInputError` subclass on
        malformed bytes.
    """

    name: str
    to_bytes: Callable[[T], bytes]
    from_bytes: Callable[[bytes], T]

    def load(self, context: Context) -> T | None:
        """Return the stored value, or None when the slot is absent or does not decode.

        A slot that does not decode reads as empty (the protocol starts afresh) rather than
        failing the client: only the decoder's :class:`ClientInputError` is caught, so a bug
        is never mistaken for a corrupted slot.

        Parameters
        ----------
        context : Context
            The node's context.

        Returns
        -------
        T or None
            The decoded value.
        """
        record = context.state.config_records.get(self.name)
        data = None if record is None else record.get(_SLOT_FIELD)
        if not isinstance(data, bytes):
            return None
        try:
            return self.from_bytes(data)
        except ClientInputError:
            return None

    def store(self, context: Context, value: T) -> None:
        """Replace the slot's value.

        Parameters
        ----------
        context : Context
            The node's context.
        value : T
            The value to keep.
        """
        context.state[self.name] = ConfigRecord({_SLOT_FIELD: self.to_bytes(value)})

    def clear(self, context: Context) -> None:
        """Remove the slot's value (no-op when absent).

        Parameters
        ----------
        context : Context
            The node's context.
        """
        if self.name in context.state:
            del context.state[self.name]
