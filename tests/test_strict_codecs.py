"""Every strict decoder against the frozen samples: truncations, trailing bytes, magic, version
and random corruptions raise the format's ClientInputError subclass and nothing else
(:mod:`tests.strict_codec`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.crypto import channel, dcf, dpf
from flwr_fsl.families.privhfl import flow as privhfl_flow
from flwr_fsl.families.privhfl import messages as ps
from flwr_fsl.families.privhfl import protocol as privhfl
from flwr_fsl.families.secagg import protocol as secagg
from flwr_fsl.families.sesa import protocol as sesa
from flwr_fsl.families.sfsl.messages import decode_shared_runs
from flwr_fsl.families.sfsl.perturb import PermanentMemo
from flwr_fsl.families.ssa import psr
from flwr_fsl.families.ssa.protocol import SSAInputError
from flwr_fsl.families.width.messages import WidthAssignment
from flwr_fsl.helper import wire
from tests.strict_codec import check_strict_decoder, strict_decoder_findings
from tests.vectors import generate

FROZEN: dict[str, Any] = json.loads(generate.PATH.read_text())


def _hex(section: str, *names: str) -> bytes:
    value: Any = FROZEN[section]
    for name in names:
        value = value[name]
    return bytes.fromhex(value)


_SESA_PARAMS = sesa.SesaParams.from_bytes(_hex("sesa", "params"))
_SECAGG_LENGTH = secagg.SecAggParams.from_bytes(_hex("secagg", "params")).vector_length


def _open(blob: bytes) -> bytes:
    return channel.open_sealed(generate._key(702), blob, associated_data=generate._raw_ad())


# name -> (sample, decoder, error, magic offset, version offset)
Case = tuple[bytes, Callable[[bytes], Any], type[Exception], int | None, int | None]
CASES: dict[str, Case] = {
    "dpf-keys": (_hex("dpf", "batch", "key0"), dpf.DPFKeyBatch.from_bytes, dpf.DPFKeyError, 0, 4),
    "dpf-hint": (_hex("dpf", "batch", "hint"), dpf.UpdateHint.from_bytes, dpf.DPFKeyError, 0, 4),
    "dcf-keys": (
        _hex("dcf", "tau2-d16", "key1"),
        dcf.DCFKeyBatch.from_bytes,
        dcf.DCFKeyError,
        0,
        4,
    ),
    "dcf-public": (
        _hex("dcf", "scalar-d8", "public"),
        dcf.DCFPublicBatch.from_bytes,
        dcf.DCFKeyError,
        0,
        4,
    ),
    "sealed-box": (
        bytes.fromhex(FROZEN[generate.SEALED_KEY]["raw"]),
        _open,
        channel.SealedBoxError,
        0,
        4,
    ),
    "rr-memo": (_hex("perturb", "memo"), PermanentMemo.from_bytes, ClientInputError, 0, 4),
    "width": (_hex("width", "shards"), WidthAssignment.from_bytes, WireFormatError, 4, 8),
    "privhfl-message": (
        _hex("privhfl", "message-matmul-deal"),
        privhfl.Message.from_bytes,
        privhfl.PrivHFLMessageError,
        0,
        4,
    ),
    "privhfl-architecture": (
        _hex("privhfl", "architecture-gap"),
        privhfl_flow.architecture_from_bytes,
        WireFormatError,
        0,
        4,
    ),
    "privhfl-answerer-state": (
        _hex("privhfl", "answerer-state"),
        privhfl_flow.AnswererState.from_bytes,
        WireFormatError,
        0,
        4,
    ),
    "sesa-params": (_hex("sesa", "params"), sesa.SesaParams.from_bytes, sesa.SesaError, 0, 4),
    "sesa-ids": (_hex("sesa", "ids"), sesa.decode_ids, sesa.SesaError, 0, 4),
    "sesa-roster": (_hex("sesa", "roster"), sesa._roster_from_bytes, sesa.SesaError, 0, 4),
    "sesa-masked": (
        _hex("sesa", "masked"),
        lambda b: sesa._masked_from_bytes(b, _SESA_PARAMS),
        sesa.SesaError,
        0,
        4,
    ),
    "sesa-evaluation": (
        _hex("sesa", "evaluation"),
        lambda b: sesa._evaluation_from_bytes(b, _SESA_PARAMS),
        sesa.SesaError,
        0,
        4,
    ),
    "sesa-request": (
        _hex("sesa", "request"),
        lambda b: sesa._request_from_bytes(b, 4),
        sesa.SesaError,
        0,
        4,
    ),
    "sesa-piece": (
        _hex("sesa", "piece"),
        lambda b: sesa._decode_piece(b, _SESA_PARAMS, 4, 9, [2, 1]),
        sesa.SesaError,
        0,
        4,
    ),
    "sesa-client-state": (
        _hex("sesa", "state-fresh"),
        sesa.SesaClient.from_bytes,
        sesa.SesaError,
        0,
        4,
    ),
    "secagg-params": (
        _hex("secagg", "params"),
        secagg.SecAggParams.from_bytes,
        secagg.SecAggError,
        0,
        4,
    ),
    "secagg-ids": (_hex("secagg", "ids"), secagg.decode_ids, secagg.SecAggError, None, None),
    "secagg-roster": (
        _hex("secagg", "roster"),
        secagg._roster_from_bytes,
        secagg.SecAggError,
        None,
        None,
    ),
    "secagg-unmask-request": (
        _hex("secagg", "unmask-request"),
        secagg.UnmaskRequest.from_bytes,
        secagg.SecAggError,
        None,
        None,
    ),
    "secagg-unmask-reply": (
        _hex("secagg", "unmask-reply"),
        secagg._unmask_reply_from_bytes,
        secagg.SecAggError,
        None,
        None,
    ),
    "secagg-rows": (
        _hex("secagg", "rows"),
        lambda b: secagg.decode_rows(b, _SECAGG_LENGTH),
        secagg.SecAggError,
        None,
        None,
    ),
    "sfsl-shared-runs": (
        _hex("sfsl-shared-runs", "runs"),
        lambda b: decode_shared_runs(b, FROZEN["sfsl-shared-runs"]["length"]),
        WireFormatError,
        None,
        None,
    ),
    "secagg-client-state": (
        _hex("secagg", "state-fresh"),
        secagg.SecAggClient.from_bytes,
        secagg.SecAggError,
        0,
        4,
    ),
    "psr-client-state": (
        _hex("client-state", "psr-state-counts"),
        psr.PSRClientState.from_bytes,
        SSAInputError,
        0,
        4,
    ),
}


def _wire_decoder(cls: type[wire.Message]) -> Callable[[bytes], Any]:
    return lambda b: wire.decode(b, cls)


for _name, _message in generate.helper_wire_messages().items():
    CASES[f"helper-wire-{_name}"] = (
        _hex("helper-wire", _name),
        _wire_decoder(type(_message)),
        WireFormatError,
        0,
        4,
    )
_SECURE: dict[str, Any] = {
    "keys-reply": ps.KeysReply,
    "generate-request": ps.GenerateRequest,
    "generate-reply": ps.GenerateReply,
    "step-request-1": ps.StepRequest,
    "step-request-2": ps.StepRequest,
    "step-reply": ps.StepReply,
    "sign-request": ps.SignRequest,
    "retrain-request": ps.RetrainRequest,
    "querier-state": ps.QuerierState,
}
for _name, _cls in _SECURE.items():
    CASES[f"privhfl-secure-{_name}"] = (
        _hex("privhfl", f"secure-{_name}"),
        _cls.from_bytes,
        WireFormatError,
        0,
        4,
    )

# Decoders that are not strict today: the check must find exactly these failures, so a fix (or
# a new failure) is noticed. Empty: every decoder above passed when this module was written.
KNOWN: dict[str, list[str]] = {}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decoder_is_strict(name: str) -> None:
    sample, decode, error, magic, version = CASES[name]
    findings = strict_decoder_findings(
        sample, decode, magic_offset=magic, version_offset=version, error=error
    )
    assert findings == KNOWN.get(name, []), "\n".join(findings)


def test_the_check_can_fail() -> None:
    # A lax decoder (IndexError on truncation, accepts trailing bytes) is reported.
    def lax(data: bytes) -> int:
        return data[0] + data[1]

    findings = strict_decoder_findings(b"\x01\x02", lax, magic_offset=None, version_offset=None)
    assert any("IndexError" in f for f in findings)
    assert any("trailing" in f for f in findings)
    with pytest.raises(AssertionError, match="not strict"):
        check_strict_decoder(b"\x01\x02", lax, magic_offset=None, version_offset=None)
