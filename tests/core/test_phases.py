"""The typed phase contract (flwr_fsl.core.phases) and its SecAgg pilot: build/parse round
trips, the records SecAgg's phases carry, PhaseMod dispatch and pass-through, and the strict
decoder of the SecAgg settings record."""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase, PhaseError, PhaseMod, phase_name
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.families.secagg.messages import SETTINGS_MAGIC, SecAggSettings
from flwr_fsl.families.secagg.protocol import SecAggParams, encode_ids
from flwr_fsl.families.secagg.records import (
    ADVERTISE,
    SECAGG_KEY,
    TRAIN,
    UNMASK,
    AdvertiseRequest,
    MaskedInputRequest,
    UnmaskSharesRequest,
)
from flwr_fsl.mods import secagg_mod
from flwr_fsl.testing import InProcessGrid

TOY = "fsl.toy"


@dataclasses.dataclass(frozen=True)
class Ping:
    """A toy request and reply: one text field."""

    text: str

    def to_record(self) -> RecordDict:
        return RecordDict({TOY: ConfigRecord({"text": self.text})})

    @classmethod
    def from_record(cls, content: RecordDict) -> Ping:
        record = content.config_records.get(TOY)
        text = None if record is None else record.get("text")
        if not isinstance(text, str):
            raise ClientInputError("the toy record lacks its text")
        return cls(text)


ECHO: Phase[Ping, Ping] = Phase(TOY, "echo", Ping, Ping)
TRAINED: Phase[Ping, Ping] = Phase(TOY, "trained", Ping, Ping, runs_train=True)


class ToyMod(PhaseMod):
    family: ClassVar[str] = TOY
    phases: ClassVar[dict[str, Phase[Any, Any]]] = {"echo": ECHO, "trained": TRAINED}

    def on_echo(self, request: Ping, context: Context) -> Ping:
        return Ping(request.text.upper())

    def on_trained(
        self, request: Ping, context: Context, train: Callable[[], Message]
    ) -> Ping | Message:
        reply = train()
        if reply.has_error():
            return reply
        return Ping(f"{request.text}+{reply.content.config_records['out']['v']}")


def _message(content: RecordDict, message_type: str = "train") -> tuple[Message, Context]:
    grid = InProcessGrid(ClientApp(), 1)  # also sets Flower's task identity for Message()
    return grid.create_message(content, message_type, 1000, "1"), grid.context(1000)


def _user_train(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"out": ConfigRecord({"v": "trained"})}), reply_to=msg)


def _params() -> SecAggParams:
    return SecAggParams(3, os.urandom(16), 2, 10)


# -- Phase: build and parse ---------------------------------------------------------------------
def test_a_phase_round_trips_its_request_with_the_phase_field_first() -> None:
    content = ECHO.build(Ping("hi"))
    assert list(content[TOY].keys()) == ["phase", "text"]  # type: ignore[union-attr]
    assert phase_name(content, TOY) == "echo"
    assert ECHO.parse_request(content) == Ping("hi")
    assert ECHO.parse_reply(Ping("x").to_record()) == Ping("x")
    with pytest.raises(PhaseError, match=r"not a fsl\.toy trained"):
        TRAINED.parse_request(content)


def test_secagg_requests_carry_the_fields_they_always_carried() -> None:
    params = _params()
    ad = ADVERTISE.build(AdvertiseRequest(params))
    assert dict(ad[SECAGG_KEY]) == {  # type: ignore[arg-type]
        "phase": "advertise",
        "instance": "model",
        "params": params.to_bytes(),
    }
    assert ADVERTISE.parse_request(ad) == AdvertiseRequest(params)
    un = UNMASK.build(UnmaskSharesRequest(params, b"\x01\x02", "rows"))
    assert list(un[SECAGG_KEY].keys()) == ["phase", "instance", "params", "request"]  # type: ignore[union-attr]
    assert UNMASK.parse_request(un) == UnmaskSharesRequest(params, b"\x01\x02", "rows")
    # The train request: the user's records first, then SecAgg's with U2 and the settings.
    settings = SecAggSettings(names=("w",))
    beside = RecordDict({"arrays": ConfigRecord({"x": 1}), "config": ConfigRecord()})
    train = TRAIN.build(MaskedInputRequest(params, (4, 9), settings, beside=beside))
    assert list(train.keys()) == ["arrays", "config", SECAGG_KEY]
    record = train[SECAGG_KEY]
    assert list(record.keys()) == ["phase", "instance", "params", "sharers", "settings"]  # type: ignore[union-attr]
    assert record["sharers"] == encode_ids([4, 9])  # type: ignore[index]
    parsed = TRAIN.parse_request(train)
    assert (parsed.sharers, parsed.settings, set(parsed.beside.keys())) == (
        (4, 9),
        settings,
        {"arrays", "config"},
    )


def test_a_malformed_secagg_request_is_client_input() -> None:
    content = ADVERTISE.build(AdvertiseRequest(_params()))
    content[SECAGG_KEY]["params"] = b"short"  # type: ignore[index]
    with pytest.raises(ClientInputError):
        ADVERTISE.parse_request(content)
    train = TRAIN.build(MaskedInputRequest(_params(), (1, 2), SecAggSettings(names=("w",))))
    train[SECAGG_KEY]["settings"] = SecAggSettings().to_bytes()[:-1]  # type: ignore[index]
    with pytest.raises(ClientInputError):
        TRAIN.parse_request(train)


# -- PhaseMod: dispatch -------------------------------------------------------------------------
def test_phase_mod_dispatches_to_its_handlers() -> None:
    mod = ToyMod()
    msg, context = _message(ECHO.build(Ping("abc")))
    reply = mod(msg, context, _user_train)
    assert Ping.from_record(reply.content) == Ping("ABC")
    msg, context = _message(TRAINED.build(Ping("abc")))
    reply = mod(msg, context, _user_train)
    assert Ping.from_record(reply.content) == Ping("abc+trained")


def test_phase_mod_passes_other_messages_through() -> None:
    mod = ToyMod()
    calls: list[Message] = []

    def call_next(msg: Message, context: Context) -> Message:
        calls.append(msg)
        return Message(RecordDict({"out": ConfigRecord({"v": "passed"})}), reply_to=msg)

    for content, kind in (
        (RecordDict({"config": ConfigRecord({"lr": 0.1})}), "train"),  # a plain train message
        (ADVERTISE.build(AdvertiseRequest(_params())), "train"),  # another family's phase
        (ECHO.build(Ping("x")), "evaluate"),  # not a message type of the family's phases
    ):
        msg, context = _message(content, kind)
        reply = mod(msg, context, call_next)
        assert reply.content.config_records["out"]["v"] == "passed"
    assert len(calls) == 3


def test_an_unknown_or_unnamed_phase_is_refused() -> None:
    mod = ToyMod()
    for record in (ConfigRecord({"phase": "nope"}), ConfigRecord({"phase": 3}), ConfigRecord()):
        msg, context = _message(RecordDict({TOY: record}))
        with pytest.raises(ClientInputError):
            mod(msg, context, _user_train)


def test_a_malformed_request_is_refused_by_the_mod() -> None:
    msg, context = _message(RecordDict({TOY: ConfigRecord({"phase": "echo", "text": 5})}))
    with pytest.raises(ClientInputError, match="lacks its text"):
        ToyMod()(msg, context, _user_train)
    content = ADVERTISE.build(AdvertiseRequest(_params()))
    content[SECAGG_KEY]["params"] = b"\x00" * 45  # type: ignore[index]
    msg, context = _message(content)
    with pytest.raises(ClientInputError):
        secagg_mod(msg, context, _user_train)


def test_an_error_reply_of_the_train_function_is_returned_unchanged() -> None:
    def failing(msg: Message, context: Context) -> Message:
        from flwr.app import Error

        return Message(Error(code=0, reason="boom"), reply_to=msg)

    msg, context = _message(TRAINED.build(Ping("abc")))
    reply = ToyMod()(msg, context, failing)
    assert reply.has_error() and reply.error.reason == "boom"


class FieldMod(ToyMod):
    """A family without a phase field: ``echo`` is a query carrying a ``text`` field."""

    def phase_of(self, msg: Message, context: Context) -> Phase[Any, Any] | None:
        if msg.metadata.message_type != "query.echo" or TOY not in msg.content:
            return None
        return ECHO


def test_phase_of_recognises_a_phase_by_another_field() -> None:
    msg, context = _message(RecordDict({TOY: ConfigRecord({"text": "ab"})}), "query.echo")
    reply = FieldMod()(msg, context, _user_train)
    assert Ping.from_record(reply.content) == Ping("AB")
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    # Its phase_of passes the default's phase messages through (and vice versa).
    msg, context = _message(ECHO.build(Ping("x")))
    assert FieldMod()(msg, context, _user_train).content.config_records["out"]["v"] == "trained"
    msg, context = _message(RecordDict({TOY: ConfigRecord({"text": "ab"})}), "query.echo")
    assert ToyMod()(msg, context, _user_train).content.config_records["out"]["v"] == "trained"


def test_the_default_phase_of_names_the_phase_or_passes_through() -> None:
    msg, context = _message(ECHO.build(Ping("x")))
    assert ToyMod().phase_of(msg, context) is ECHO
    msg, context = _message(ECHO.build(Ping("x")), "evaluate")
    assert ToyMod().phase_of(msg, context) is None
    msg, context = _message(RecordDict({TOY: ConfigRecord({"phase": "nope"})}))
    with pytest.raises(PhaseError, match=r"unknown fsl\.toy phase"):
        ToyMod().phase_of(msg, context)


# -- the SecAgg settings record -----------------------------------------------------------------
SETTINGS = SecAggSettings(
    metrics=("train_loss", "acc"), names=("conv.weight", "fc.bias"), max_clients=300
)


def test_settings_round_trip() -> None:
    data = SETTINGS.to_bytes()
    assert data.startswith(SETTINGS_MAGIC + b"\x02")  # unit weights: version 2
    assert SecAggSettings.from_bytes(data) == SETTINGS
    layout = SETTINGS.layout({"conv.weight": (2, 3), "fc.bias": (4,)})
    assert (layout.names, layout.length) == (("conv.weight", "fc.bias"), 6 + 4 + 1 + 4)


def test_settings_decoder_rejects_every_truncation_and_trailing_bytes() -> None:
    data = SETTINGS.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(WireFormatError):
            SecAggSettings.from_bytes(data[:cut])
    with pytest.raises(WireFormatError, match="trailing"):
        SecAggSettings.from_bytes(data + b"\x00")


def test_settings_decoder_rejects_bad_magic_version_text_and_values() -> None:
    data = SETTINGS.to_bytes()
    with pytest.raises(WireFormatError, match="version"):
        SecAggSettings.from_bytes(data[:4] + b"\x03" + data[5:])
    with pytest.raises(WireFormatError, match="not SecAgg settings"):
        SecAggSettings.from_bytes(b"XXXX" + data[4:])
    with pytest.raises(WireFormatError):
        SecAggSettings.from_bytes("text")  # type: ignore[arg-type]
    bad_utf8 = data.replace(b"fc.bias", b"fc.bia\xff")
    with pytest.raises(WireFormatError, match="UTF-8"):
        SecAggSettings.from_bytes(bad_utf8)
    # Well-formed bytes whose settings do not validate: max_clients 1 (the u32 before the
    # version-2 flags weighted and dp).
    with pytest.raises(WireFormatError, match="max_clients"):
        SecAggSettings.from_bytes(data[:-6] + struct.pack("<I", 1) + data[-2:])
    # A NaN clipping range.
    nan = struct.pack("<d", float("nan"))
    clip_at = data.index(struct.pack("<d", SETTINGS.clip))
    with pytest.raises(WireFormatError, match="clipping_range"):
        SecAggSettings.from_bytes(data[:clip_at] + nan + data[clip_at + 8 :])
    assert isinstance(WireFormatError("x"), ClientInputError)


def test_settings_are_validated_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="train_metrics"):
        SecAggSettings(metrics=("num-examples",))
    with pytest.raises(ConfigurationError, match="names"):
        SecAggSettings(names=("w", "w"))
    with pytest.raises(ConfigurationError, match="max_clients"):
        SecAggSettings(max_weight=1e12, frac_bits=30, weighted=True)
    with pytest.raises(ConfigurationError, match="frac_bits"):
        SecAggSettings(frac_bits=True)  # type: ignore[arg-type]
