"""The byte messages of PrivHFL's secure answering (flwr_fsl.families.privhfl.messages): every one
round-trips, every decoder is strict (wrong kind, version, truncation, trailing bytes, repeated
node ids, bad settings) and fuzzed mutations either decode or raise a ClientInputError; the
sealed seed opens only under the binding it was sealed with."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.crypto.channel import SealingKeyPair, client_party
from flwr_fsl.crypto.sealing import open_from, seal_for
from flwr_fsl.families.privhfl.messages import (
    SEED_PURPOSE,
    AnswererInfo,
    GenerateReply,
    GenerateRequest,
    KeysReply,
    KeysRequest,
    QuerierSessionState,
    QuerierState,
    RetrainRequest,
    SessionDeal,
    SignReply,
    SignRequest,
    StepEntry,
    StepReply,
    StepRequest,
    binding,
)
from flwr_fsl.families.privhfl.protocol import PrivHFLConfig

CFG = PrivHFLConfig(comparison="dcf")
RUN = bytes(range(16))


def _examples() -> list[Any]:
    info = AnswererInfo(7, b"k" * 32, b"arch", b"s" * 16)
    return [
        KeysRequest(RUN),
        KeysReply(b"p" * 32, b"PHAR..."),
        GenerateRequest(CFG, 3, RUN, (info, AnswererInfo(9, b"q" * 32, b"", b"t" * 16))),
        GenerateReply(4, (SessionDeal(7, b"sealed", (b"share", b"deal1", b"")),)),
        StepRequest(CFG, 1, 3, RUN, (StepEntry(5, b"data", b"sealed", b"a" * 16, 4),)),
        StepRequest(CFG, 2, 3, RUN, (StepEntry(5, b"data"), StepEntry(6, b""))),
        StepReply(((5, b"reply"), (6, b""))),
        RetrainRequest(CFG, 3, b"agg"),
        SignRequest(PrivHFLConfig(comparison="drelu"), 2, 3, ((7, b"z"), (9, b""))),
        SignReply(((7, b"sign"),)),
        QuerierState(1, 1, 4, (QuerierSessionState(7, b"q" * 16, b"s" * 16, b"arch", 12),)),
    ]


@pytest.mark.parametrize("msg", _examples(), ids=lambda m: type(m).__name__)
def test_round_trip_and_strictness(msg: Any) -> None:
    data = msg.to_bytes()
    assert type(msg).from_bytes(data) == msg
    with pytest.raises(WireFormatError):
        type(msg).from_bytes(data + b"\x00")
    with pytest.raises(WireFormatError):
        type(msg).from_bytes(data[:-1])
    with pytest.raises(WireFormatError):
        type(msg).from_bytes(data[:4] + b"\x02" + data[5:])  # version
    other = next(m for m in _examples() if type(m) is not type(msg))
    with pytest.raises(WireFormatError):
        type(msg).from_bytes(other.to_bytes())  # another kind
    with pytest.raises(WireFormatError):
        type(msg).from_bytes("text")


def test_decoders_refuse_repeated_ids_empty_lists_and_bad_settings() -> None:
    info = AnswererInfo(7, b"k" * 32, b"arch", b"s" * 16)
    with pytest.raises(WireFormatError, match="repeated"):
        GenerateRequest.from_bytes(GenerateRequest(CFG, 1, RUN, (info, info)).to_bytes())
    with pytest.raises(WireFormatError, match="at least one"):
        GenerateRequest.from_bytes(GenerateRequest(CFG, 1, RUN, ()).to_bytes())
    with pytest.raises(WireFormatError, match="repeated"):
        StepReply.from_bytes(StepReply(((5, b""), (5, b""))).to_bytes())
    with pytest.raises(WireFormatError, match="at least one"):
        StepRequest.from_bytes(StepRequest(CFG, 2, 1, RUN, ()).to_bytes())
    with pytest.raises(WireFormatError, match="step"):
        StepRequest.from_bytes(StepRequest(CFG, 0, 1, RUN, (StepEntry(1, b""),)).to_bytes())
    data = bytearray(RetrainRequest(CFG, 3, b"agg").to_bytes())
    data[6] = 9  # unknown comparison code
    with pytest.raises(WireFormatError, match="comparison"):
        RetrainRequest.from_bytes(bytes(data))
    data = bytearray(RetrainRequest(CFG, 3, b"agg").to_bytes())
    data[7], data[8] = 40, 30  # frac bits above the bound: invalid settings
    with pytest.raises(WireFormatError, match="settings"):
        RetrainRequest.from_bytes(bytes(data))
    with pytest.raises(WireFormatError, match="batch"):
        GenerateReply.from_bytes(GenerateReply(0, ()).to_bytes())
    with pytest.raises(WireFormatError, match="at least one"):
        SignRequest.from_bytes(SignRequest(CFG, 1, 1, ()).to_bytes())
    with pytest.raises(WireFormatError, match="repeated"):
        SignReply.from_bytes(SignReply(((1, b""), (1, b""))).to_bytes())


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10), st.integers(0, 120), st.binary(min_size=1, max_size=12))
def test_fuzzed_messages_decode_or_raise_client_input_error(
    which: int, at: int, noise: bytes
) -> None:
    msg = _examples()[which]
    data = msg.to_bytes()
    mutated = data[:at] + noise + data[at + len(noise) :]
    for cls in {type(m) for m in _examples()}:
        try:
            cls.from_bytes(mutated)
        except ClientInputError:
            pass


def test_sealed_seed_opens_only_under_its_binding() -> None:
    answerer = SealingKeyPair.generate()
    bind = binding(RUN, 2, CFG, 2)
    seed = b"x" * 16
    sealed = seal_for(
        answerer.public_bytes, seed, purpose=SEED_PURPOSE, binding=bind,
        sender=client_party(1), recipient=client_party(2),
    )  # fmt: skip
    kwargs = {"purpose": SEED_PURPOSE, "sender": client_party(1), "recipient": client_party(2)}
    assert open_from(answerer, sealed, binding=bind, **kwargs) == seed
    for other in (binding(RUN, 3, CFG, 2), binding(RUN, 2, CFG, 3), binding(bytes(16), 2, CFG, 2)):
        with pytest.raises(ClientInputError):
            open_from(answerer, sealed, binding=other, **kwargs)
    with pytest.raises(ClientInputError):
        open_from(answerer, sealed, binding=bind, **{**kwargs, "sender": client_party(3)})
    with pytest.raises(ClientInputError):
        open_from(SealingKeyPair.generate(), sealed, binding=bind, **kwargs)
