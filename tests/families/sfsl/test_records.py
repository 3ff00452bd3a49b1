"""SFSL's perturb reply: bounded by the union before the server copies anything of its size."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.families.sfsl.protocol import check_perturbed
from flwr_fsl.families.sfsl.records import PerturbReply

UNION = np.array([2, 5, 9, 11], dtype=np.int64)


def test_the_reply_is_a_view_of_the_message() -> None:
    reply = PerturbReply.from_record(PerturbReply(np.array([5, 11])).to_record())
    assert not reply.rows.flags.owndata  # nothing of the client's size is allocated yet
    np.testing.assert_array_equal(check_perturbed(reply.rows, UNION), [5, 11])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (np.arange(5), "bad length"),  # longer than the union
        (np.zeros((1, 2), np.int64), "bad length"),
        (np.array([9, 5]), "increasing"),
        (np.array([5, 5]), "increasing"),
        (np.array([3]), "increasing rows of the union"),
    ],
)
def test_a_bad_perturbed_set_is_refused(rows: np.ndarray, message: str) -> None:
    with pytest.raises(ClientInputError, match=message):
        check_perturbed(rows, UNION)


def test_a_ragged_byte_string_is_refused() -> None:
    content = PerturbReply(np.array([5])).to_record()
    content["fsl.secagg"]["perturbed"] = b"\x00" * 12
    with pytest.raises(ClientInputError, match="bad length"):
        PerturbReply.from_record(content)
