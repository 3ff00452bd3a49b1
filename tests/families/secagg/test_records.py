"""SecAgg's masked-input reply: read at the size the server expects, never at the client's."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from flwr_fsl.families.secagg.protocol import MaskedWords
from flwr_fsl.families.secagg.records import MaskedInputReply, masked_input_record
from flwr_fsl.submodel.codec import SubmodelFormatError


def test_the_reply_is_parsed_only_at_the_expected_size(monkeypatch: pytest.MonkeyPatch) -> None:
    content = masked_input_record(np.arange(5, dtype=np.uint64))
    reply = MaskedInputReply.from_record(content)
    assert isinstance(reply, MaskedWords)
    np.testing.assert_array_equal(reply.words(5), np.arange(5, dtype=np.uint64))
    loads: list[int] = []
    original = Array.numpy
    monkeypatch.setattr(Array, "numpy", lambda self: loads.append(1) or original(self))
    with pytest.raises(SubmodelFormatError, match="3 uint64 words"):
        reply.words(3)  # a client that sends more words than its round has
    assert loads == []  # refused from the metadata: its bytes were never copied


@pytest.mark.parametrize(
    "array",
    [np.zeros((2, 2), np.uint64), np.zeros(4, np.int64), np.zeros(4, np.float64)],
)
def test_another_dtype_or_shape_is_refused_at_parse(array: np.ndarray) -> None:
    content = masked_input_record(np.zeros(4, np.uint64))
    content["fsl.secagg"]["masked"] = Array(array)
    with pytest.raises(SubmodelFormatError, match="uint64 words"):
        MaskedInputReply.from_record(content)


def test_a_clients_own_vector_is_checked_too() -> None:
    reply = MaskedInputReply(np.ones(4, np.uint64))
    assert reply.words(4).sum() == 4
    with pytest.raises(SubmodelFormatError, match="2 uint64 words"):
        reply.words(2)


def test_a_parsed_reply_reencodes_as_it_came() -> None:
    content = masked_input_record(np.arange(3, dtype=np.uint64))
    again = MaskedInputReply.from_record(MaskedInputReply.from_record(content).to_record())
    np.testing.assert_array_equal(again.words(3), np.arange(3, dtype=np.uint64))
