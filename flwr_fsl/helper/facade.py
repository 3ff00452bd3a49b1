"""S0's requests to S1, whatever the transport: the shared layer of both connections.

:class:`HelperFacade` builds every request of :class:`HelperConnection` (encoded with
:mod:`flwr_fsl.helper.wire`), hands the bytes to its transport and checks the response;
:class:`~flwr_fsl.helper.connection.HelperClient` (gRPC) and
:class:`~flwr_fsl.helper.connection.InProcessHelper` (S1 in this process) supply the
transport only, so simulation runs the deployment's request path byte for byte. It also keeps
the connection's session (id and secret, see :mod:`flwr_fsl.helper.connection`). Split out of
:mod:`flwr_fsl.helper.connection`, which re-exports :class:`HelperConnection`,
:class:`HelperHealth` and :class:`HelperShare`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.crypto.channel import SealedBoxError, public_key_fingerprint
from flwr_fsl.families.ssa.two_server import HelperParty
from flwr_fsl.helper import wire
from flwr_fsl.helper.errors import (
    HelperError,
    HelperRequestError,
    HelperSessionLostError,
    WireFormatError,
)

__all__ = ["HelperConnection", "HelperFacade", "HelperHealth", "HelperShare"]

M = TypeVar("M", bound=wire.Message)


@dataclass(frozen=True)
class HelperHealth:
    """S1's status.

    Attributes
    ----------
    protocol_version : int
        Wire format version S1 speaks.
    fingerprint : str
        Hex SHA-256 of S1's public key.
    """

    protocol_version: int
    fingerprint: str


class HelperShare(NamedTuple):
    """S1's result of a finished SSA round (a named tuple: ``ids, share = finish_round(r)``).

    Attributes
    ----------
    client_ids : tuple[int, ...]
        The clients (sorted) whose keys are in the share: S0 must aggregate exactly these.
    share : numpy.ndarray
        S1's additive share of the aggregate, ``(m, tau)`` uint64.
    """

    client_ids: tuple[int, ...]
    share: NDArray[np.uint64]


@runtime_checkable
class HelperConnection(HelperParty, Protocol):
    """What S0 can ask S1: the round calls of a ``HelperParty``, plus status and closing.

    The round calls are :class:`~flwr_fsl.families.ssa.two_server.HelperParty`'s (see
    :mod:`flwr_fsl.helper.services.ssa` for the round life cycle).

    A connection is one session on S1: every round-scoped call carries :attr:`session_id`.
    """

    def health(self) -> HelperHealth:
        """Return S1's status (also a reachability check)."""
        ...

    def close(self) -> None:
        """End the session on S1 (best effort) and release the connection (idempotent)."""
        ...


class HelperFacade(abc.ABC):
    """Shared request building and response checking of both transports."""

    _session_id: bytes = b""
    _secret: bytes = b""
    _session_live: bool = False

    @property
    def session_id(self) -> bytes:
        """The 16-byte id S1 drew for this connection's session (clients bind material to it).

        Reading it before any session was opened opens one (:meth:`open_session`). After
        :meth:`open_session` (e.g. once S1 lost the session) it is the new session's id.
        """
        if not self._session_id:
            self.open_session()
        return self._session_id

    def open_session(self) -> None:
        """Start a new session on S1 now (otherwise the first round or :attr:`session_id` does).

        S1 draws the session's id and secret; the connection keeps both. Also the way back
        after :class:`HelperSessionLostError`: the new session is empty (no rounds, no stored
        keys) and has a new id. A session this connection still holds is closed first.

        Raises
        ------
        HelperRequestError
            If S1 holds too many sessions.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        if self._session_live:
            self._close_session_quietly()
        r = self._call("OpenSession", wire.OpenSessionRequest(), wire.SessionInfoResponse)
        self._session_id, self._secret, self._session_live = r.session, r.secret, True

    def _sid(self) -> bytes:
        """Return the current session's id for a round call (which never opens a session)."""
        if not self._session_id:
            raise HelperRequestError("unknown session: none was opened on this connection")
        return self._session_id

    def close_session(self) -> None:
        """End this connection's session on S1: S1 drops its rounds and stored keys.

        Raises
        ------
        HelperRequestError
            If no session was opened, or S1 does not know it (already closed or lost).
        HelperUnavailableError
            If S1 cannot be reached.
        """
        if not self._session_id:
            raise HelperRequestError("no session was opened on this connection")
        self._session_live = False
        self._call("CloseSession", wire.CloseSessionRequest(self._session_id), wire.OkResponse)

    def _close_session_quietly(self) -> None:
        if not self._session_live:
            return
        try:
            self.close_session()
        except HelperError:  # never opened a round, already gone, or S1 unreachable
            pass

    @abc.abstractmethod
    def _transport(self, method: str, body: bytes) -> bytes:
        """Send one encoded request and return the encoded response."""

    def _call(self, method: str, request: wire.Message, expected: type[M]) -> M:
        try:
            body = wire.encode(request)
        except WireFormatError as err:
            raise HelperRequestError(f"cannot encode {method} request: {err}") from None
        try:
            response = self._transport(method, body)
        except HelperSessionLostError:
            self._session_live = False  # keep the id: later calls fail until open_session()
            raise
        try:
            return wire.decode(response, expected)
        except WireFormatError as err:
            raise HelperError(f"malformed {method} response from S1: {err}") from None

    def health(self) -> HelperHealth:
        """Return S1's status (also a reachability check).

        Returns
        -------
        HelperHealth
            Wire version and key fingerprint (S1 says nothing about sessions or rounds).

        Raises
        ------
        HelperError
            If S1 is unreachable or answers with a malformed public key.
        """
        r = self._call("Health", wire.HealthRequest(), wire.HealthResponse)
        try:
            fp = public_key_fingerprint(r.public_key)
        except SealedBoxError as err:
            raise HelperError(f"S1 announced a malformed public key: {err}") from None
        return HelperHealth(r.protocol_version, fp)

    def public_key(self) -> bytes:
        """Return S1's raw 32-byte X25519 public key.

        Raises
        ------
        HelperError
            If S1 is unreachable or the key is not 32 bytes.
        """
        key = self._call("PublicKey", wire.PublicKeyRequest(), wire.PublicKeyResponse).public_key
        if len(key) != 32:
            raise HelperError(f"S1 announced a {len(key)}-byte public key, expected 32")
        return key

    def open_round(self, round_id: int, params: bytes, digest_key: bytes | None = None) -> None:
        """Open a round on S1.

        Parameters
        ----------
        round_id : int
            The round (must equal ``params``' ``round_id``; never reused).
        params : bytes
            ``SSAParams.to_bytes()``.
        digest_key : bytes, optional
            A checked round's secret digest key (sent with ``OpenCheckedRound``).

        The connection's first round opens its session first (:meth:`open_session`); a later
        one does not (not even after a lost session), so a restarted S1 is noticed rather than
        papered over.

        Raises
        ------
        HelperRequestError
            If the round was opened before, too many are open, or the parameters are bad.
        HelperSessionLostError
            If S1 no longer holds the session (restarted, expired): call
            :meth:`open_session`, then open the round again.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        if not self._session_id:
            self.open_session()
        request = wire.OpenRoundRequest(self._sid(), round_id, params)
        if digest_key is not None:
            request = wire.OpenCheckedRoundRequest(self._sid(), round_id, params, digest_key)
        method = request.KIND.name.title().replace("_", "")  # OpenRound, OpenCheckedRound
        self._call(method, request, wire.OkResponse)

    def add_clients(
        self, round_id: int, uploads: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, str]:
        """Relay clients' SSA uploads to S1.

        Parameters
        ----------
        round_id : int
            An open round.
        uploads : iterable of (int, bytes, bytes)
            ``(client_id, public_part, sealed)``; ``sealed`` from
            :func:`~flwr_fsl.helper.sealing.seal_ssa_upload`.

        Returns
        -------
        dict[int, str]
            Client id -> reason, for the rejected clients only (they are not in S1's share;
            drop them on S0 as well).

        Raises
        ------
        HelperRequestError
            If the round is not open, the request is malformed or repeats a client id.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        items = _unique(tuple(wire.SealedItem(int(c), p, s) for c, p, s in uploads))
        r = self._call("AddClients", wire.AddClientsRequest(self._sid(), round_id, items), _Results)
        return _rejections(r, items)

    def add_client_hints(
        self, round_id: int, hints: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, str]:
        """Relay clients' public U-DPF hints to S1 (no sealing: the hint is public).

        Parameters
        ----------
        round_id : int
            An open round whose parameters carry the new epoch.
        hints : iterable of (int, bytes)
            ``(client_id, hint)``.

        Returns
        -------
        dict[int, str]
            Client id -> reason, for the rejected clients only.

        Raises
        ------
        HelperRequestError
            If the round is not open or the request is malformed.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        items = _unique(tuple(wire.HintItem(int(c), h, s) for c, h, s in hints))
        r = self._call(
            "AddClientHints", wire.AddHintsRequest(self._sid(), round_id, items), _Results
        )
        return _rejections(r, items)

    def add_checked(
        self, round_id: int, items: Iterable[tuple[int, bytes, bytes, bytes]], *, hints: bool
    ) -> dict[int, str | bytes]:
        """Relay a checked round's uploads (or U-DPF hints) with S0's key-check digests.

        Parameters
        ----------
        round_id : int
            An open round whose parameters carry ``verify``.
        items : iterable of (int, bytes, bytes, bytes)
            ``(client_id, public part or hint, sealed, S0's digest)``.
        hints : bool
            True for U-DPF hints, False for fresh uploads.

        Returns
        -------
        dict[int, str | bytes]
            Client id -> S1's digest (bytes) when S1 accepted it, else S1's reason (str).

        Raises
        ------
        HelperRequestError
            If the round is not open, does not check keys, or the request is malformed.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        checked = tuple(wire.CheckedItem(int(c), b, s, d) for c, b, s, d in items)
        if len({it.client_id for it in checked}) != len(checked):
            raise HelperRequestError("duplicate client ids in one request")
        kind = wire.AddCheckedHintsRequest if hints else wire.AddCheckedRequest
        method = "AddCheckedHints" if hints else "AddCheckedClients"
        r = self._call(method, kind(self.session_id, round_id, checked), _Results)
        if [res.client_id for res in r.results] != [it.client_id for it in checked]:
            raise HelperError("S1 answered for other clients than it was asked about")
        return {res.client_id: res.payload if res.ok else res.reason for res in r.results}

    def finish_round(self, round_id: int) -> HelperShare:
        """Close a round and fetch S1's share.

        Parameters
        ----------
        round_id : int
            An open round.

        Returns
        -------
        HelperShare
            ``(client_ids, share)``: the ids of the clients in S1's share and the
            ``(m, tau)`` uint64 share.

        Raises
        ------
        HelperRequestError
            If the round is not open.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        r = self._call(
            "FinishRound", wire.FinishRoundRequest(self._sid(), round_id), wire.ShareResponse
        )
        return HelperShare(r.client_ids, r.share)

    def abort_round(self, round_id: int) -> None:
        """Drop an open round (S1 keeps no result and no U-DPF keys from it).

        Raises
        ------
        HelperRequestError
            If the round is not open.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        self._call("AbortRound", wire.AbortRoundRequest(self._sid(), round_id), wire.OkResponse)

    def set_model(self, round_id: int, table: NDArray[np.uint64]) -> None:
        """Give S1 the table that the round's PSR queries are answered from.

        Parameters
        ----------
        round_id : int
            An open round.
        table : numpy.ndarray
            ``(m, value_width)`` uint64 (see :func:`flwr_fsl.families.ssa.psr.encode_table`).

        Raises
        ------
        HelperRequestError
            If the round is not open, already has a table, or the table has the wrong
            dtype or shape.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        arr = np.asarray(table)
        if arr.dtype != np.uint64:
            raise HelperRequestError(f"PSR table must be uint64, got {arr.dtype}")
        self._call("SetModel", wire.SetModelRequest(self._sid(), round_id, arr), wire.OkResponse)

    def psr_answer(
        self, round_id: int, queries: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, bytes | str]:
        """Relay clients' PSR queries; collect S1's answers sealed to each client.

        Parameters
        ----------
        round_id : int
            An open round with a table.
        queries : iterable of (int, bytes, bytes)
            ``(client_id, public_part, sealed)``; ``sealed`` from
            :func:`~flwr_fsl.helper.sealing.seal_psr_query`.

        Returns
        -------
        dict[int, bytes | str]
            Client id -> sealed answer (bytes, relay it to the client) or rejection reason
            (str).

        Raises
        ------
        HelperRequestError
            If the round is not open or has no table, or the request is malformed.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        items = _unique(tuple(wire.SealedItem(int(c), p, s) for c, p, s in queries))
        r = self._call("PsrAnswer", wire.PsrAnswerRequest(self._sid(), round_id, items), _Results)
        _check_clients(r, items)
        return {res.client_id: (res.payload if res.ok else res.reason) for res in r.results}

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources (idempotent)."""


_Results = wire.ClientResultsResponse
_I = TypeVar("_I", wire.SealedItem, wire.HintItem)


def _unique(items: tuple[_I, ...]) -> tuple[_I, ...]:
    ids = [it.client_id for it in items]
    if len(set(ids)) != len(ids):
        dup = sorted({c for c in ids if ids.count(c) > 1})
        raise HelperRequestError(f"duplicate client ids in one request: {dup}")
    return items


def _check_clients(
    response: wire.ClientResultsResponse, items: tuple[wire.SealedItem | wire.HintItem, ...]
) -> None:
    if [r.client_id for r in response.results] != [it.client_id for it in items]:
        raise HelperError("S1 answered for other clients than it was asked about")


def _rejections(
    response: wire.ClientResultsResponse, items: tuple[wire.SealedItem | wire.HintItem, ...]
) -> dict[int, str]:
    _check_clients(response, items)
    return {res.client_id: res.reason for res in response.results if not res.ok}
