"""The in-process driver's message buffers (``wire.MessageBuffers``, ``protocol.LocalDriver``).

A message built in a lent buffer must be the same bytes as a fresh one, parse in place, and
no party may read it once the driver has taken the buffer back: a poisoned pool (every
buffer overwritten when handed back) must give exactly the answers of the plain path.
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.privhfl import protocol as privhfl
from flwr_fsl.families.privhfl import wire
from flwr_fsl.families.privhfl.flow import QuerierDeals
from flwr_fsl.families.privhfl.inference import Architecture, ReLU, from_torch
from flwr_fsl.families.privhfl.messages import GenerateReply, SessionDeal, encode_generate_reply
from flwr_fsl.families.privhfl.protocol import (
    LocalDriver,
    Message,
    MessageBuffers,
    PrivHFLConfig,
    PrivHFLMessageError,
    QuerierMessageError,
    Transcript,
    secure_predict,
)
from tests.families.privhfl.test_protocol import (
    BAD,
    LAYER_CASES,
    U64,
    _tamper,
    random_model,
    seeds_from,
    tiny_models,
)

NEVER = 1 << 62  # a min_bytes no message reaches: nothing is lent (the plain path)


def _lent(data: bytes) -> memoryview:
    """The message as a driver lends it: a read-only view of a (larger) writable buffer."""
    buf = np.full(len(data) + 40, 0x5A, np.uint8)
    buf[: len(data)] = np.frombuffer(data, np.uint8)
    return memoryview(buf[: len(data)].data).toreadonly()


# ---------------------------------------------------------------- the pool


def test_small_messages_are_not_lent_and_buffers_are_reused() -> None:
    pool = MessageBuffers(min_bytes=100)
    assert pool.lend(99) is None and pool.held_bytes == 0
    a = pool.lend(1000)
    b = pool.lend(300)
    assert a is not None and b is not None and (a.size, b.size) == (1000, 300)
    assert not np.shares_memory(a, b) and pool.held_bytes == 1300
    pool.recycle()
    c = pool.lend(200)  # the smallest free buffer that fits: b's
    d = pool.lend(900)  # then a's
    assert c is not None and d is not None
    assert np.shares_memory(c, b) and np.shares_memory(d, a) and pool.held_bytes == 1300
    pool.recycle()
    e = pool.lend(2000)  # no free buffer fits: the smallest is dropped, one more is made
    assert e is not None and not np.shares_memory(e, a) and not np.shares_memory(e, b)
    assert pool.held_bytes == 1000 + 2000
    pool.release()
    assert pool.held_bytes == 0


def test_poison_overwrites_every_buffer_handed_back() -> None:
    pool = MessageBuffers(min_bytes=1, poison=0xA5)
    view = pool.lend(64)
    assert view is not None
    view[:] = 7
    pool.recycle()
    assert np.all(view == 0xA5)


@pytest.mark.parametrize(
    "kwargs", [{"min_bytes": 0}, {"min_bytes": True}, {"min_bytes": 1.5}, {"poison": 256}]
)
def test_pool_settings_are_checked(kwargs: dict) -> None:
    with pytest.raises(ConfigurationError):
        MessageBuffers(**kwargs)


def test_a_message_built_in_a_lent_buffer_is_the_same_bytes_and_parses_in_place() -> None:
    rng = np.random.default_rng(4)
    arrays = (rng.integers(0, 2**63, (70, 3), dtype=U64), np.zeros(0, U64))
    msg = Message(privhfl.DCF_KEYS, 9, arrays, (b"head", b"x" * 1001))
    pool = MessageBuffers(min_bytes=1)
    lent = msg.to_bytes(pool)
    assert isinstance(lent, memoryview) and lent.readonly
    assert bytes(lent) == msg.to_bytes() == msg.to_bytes(MessageBuffers(min_bytes=NEVER))
    back = Message.from_bytes(lent)
    buf = np.frombuffer(lent, np.uint8)
    assert np.shares_memory(back.arrays[0], buf)  # zero-copy
    assert np.array_equal(back.arrays[0], arrays[0]) and bytes(back.blob)[:4] == b"head"
    # a writable buffer is still copied (it could change under the parsed message)
    mutable = bytearray(bytes(lent))
    assert not np.shares_memory(
        Message.from_bytes(mutable).arrays[0], np.frombuffer(mutable, np.uint8)
    )
    with pytest.raises(ConfigurationError, match="expected"):
        wire.assemble([b"abc"], 4, None, pool)


def test_fill_writes_into_the_lent_buffer() -> None:
    pool = MessageBuffers(min_bytes=1)
    msg = Message(privhfl.DCF_KEYS, 3, (np.arange(4, dtype=U64), np.ones(4, U64)))

    def fill(blob: np.ndarray) -> None:
        blob[:] = np.arange(blob.size) % 251

    lent = msg.to_bytes_filled(24, fill, pool)
    assert isinstance(lent, memoryview)
    assert bytes(lent) == msg.to_bytes_filled(24, fill)


def test_every_decoder_error_is_the_same_for_a_lent_view() -> None:
    good = Message(privhfl.SHARE, 1, (np.ones(3, U64),), b"abc").to_bytes()
    cases = [
        b"XHFL" + good[4:],
        good[:4] + b"\x01" + good[5:],
        good[:5] + b"\x63" + good[6:],
        good[:14] + b"\x09" + good[15:],
        good[:15] + b"\x01" + good[16:],
        good[:16] + b"\x02" + good[17:],
        good + b"\0",
        good[:-2],
        good[:3],
        b"",
    ]
    for bad in cases:
        with pytest.raises(PrivHFLMessageError) as plain:
            Message.from_bytes(bad)
        with pytest.raises(PrivHFLMessageError) as lent:
            Message.from_bytes(_lent(bad))
        assert str(lent.value) == str(plain.value)
    spread = bytes(b for c in good for b in (c, 0))
    strided = memoryview(spread)[::2].toreadonly()  # not contiguous: read from a copy
    assert bytes(strided) == good and Message.from_bytes(strided).blob_buffer() == b"abc"


def test_generate_reply_written_into_a_lent_buffer_is_the_same_bytes() -> None:
    net, shape = tiny_models()["cnn"]
    arch = from_torch(net.eval(), shape).architecture
    cfg = PrivHFLConfig()
    encoded = cfg.codec().encode(np.random.default_rng(0).uniform(0, 1, (3, 8, 8, 1)))
    seeds = seeds_from(np.random.default_rng(1))[0]
    made = QuerierDeals(cfg, arch, encoded, seeds, 0)
    lent = encode_generate_reply(3, [(5, b"sealed", made.sizes, made)], MessageBuffers(1))
    deals = QuerierDeals(cfg, arch, encoded, seeds, 0)
    joined = GenerateReply(3, (SessionDeal(5, b"sealed", tuple(deals)),)).to_bytes()
    assert isinstance(lent, memoryview) and bytes(lent) == joined
    assert GenerateReply.from_bytes(lent).sessions[0].messages == tuple(
        QuerierDeals(cfg, arch, encoded, seeds, 0)
    )


# ---------------------------------------------------------------- the driver


class _Copies(Transcript):
    """A transcript that keeps a copy of every message's bytes (a tamper hook would make the
    receivers read copies, not the lent buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, bytes]] = []

    def record(self, sender: str, receiver: str, data: wire.Wire) -> None:
        self.sent.append((sender, receiver, bytes(data)))
        super().record(sender, receiver, data)


def _run(models, x, relu: str, pool: MessageBuffers, seed: int = 7, sessions: int = 1):  # type: ignore[no-untyped-def]
    """Logits and every message (as bytes, in order) of ``sessions`` sessions on one driver.

    ``x`` is rounded to the fixed-point grid: the querier's encoding rounds stochastically,
    and two runs must deal the same messages.
    """
    x = np.round(np.asarray(x) * 2**10) / 2**10
    driver, rng, logits = LocalDriver(pool), np.random.default_rng(seed), []
    tr = _Copies()
    for s in range(sessions):
        res = driver.predict(
            models, x, PrivHFLConfig(comparison=relu), seeds=seeds_from(rng, len(models)),
            session=s, transcript=tr,
        )  # fmt: skip
        logits.append(res.logits)
    return np.stack(logits), tr.sent, tr


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
@pytest.mark.parametrize("name", ["cnn", "resnet"])
def test_poisoned_buffers_give_the_plain_answers_and_bytes(name: str, relu: str) -> None:
    # Every message is lent (min_bytes 1) and every buffer poisoned when handed back: a party
    # that kept a view of a consumed message would read 0xA5 bytes.
    net, shape = tiny_models()[name]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(3).uniform(0, 1, (5, *shape))
    plain, plain_sent, plain_tr = _run([model, model], x, relu, MessageBuffers(NEVER), sessions=2)
    pool = MessageBuffers(min_bytes=1, poison=0xA5)
    lent, lent_sent, lent_tr = _run([model, model], x, relu, pool, sessions=2)
    assert np.array_equal(plain, lent)
    assert lent_sent == plain_sent  # the same message bytes, in the same order
    assert lent_tr.records == plain_tr.records and lent_tr.seconds.keys() == plain_tr.seconds.keys()
    assert 0 < pool.held_bytes and not pool._lent  # all handed back at the end


@pytest.mark.parametrize("case", ["maxpool-3x3-s2", "residual-conv-shortcut", "avgpool"])
def test_poisoned_buffers_on_every_layer_kind(case: str) -> None:
    arch = LAYER_CASES[case]
    model = random_model(arch, np.random.default_rng(2))
    x = np.random.default_rng(5).uniform(-1, 1, (4, *arch.input_shape))
    plain, _, _ = _run([model], x, "dcf", MessageBuffers(NEVER))
    lent, _, _ = _run([model], x, "dcf", MessageBuffers(min_bytes=1, poison=0x3C))
    assert np.array_equal(plain, lent)


def test_secure_predict_lends_large_messages_and_views_are_copies() -> None:
    # The default driver lends messages from 256 KiB on; a transcript keeping views copies
    # them (they outlive the op).
    arch = Architecture((9000,), (ReLU(),))
    model = random_model(arch, np.random.default_rng(0))
    x = np.random.default_rng(1).uniform(-1, 1, (4, 9000))
    tr = Transcript(keep_views=True)
    res = secure_predict([model], x, seeds=seeds_from(np.random.default_rng(2)), transcript=tr)
    assert np.allclose(res.logits, np.maximum(x, 0), atol=1e-5)
    keys = [m for m in tr.views["A0"] if m.kind == privhfl.DCF_KEYS]
    assert keys and all(isinstance(m.blob, memoryview) for m in keys)
    assert max(n for *_, n in tr.records) >= 1 << 18


@pytest.mark.parametrize(
    ("target", "relu"),
    [
        (("A1", "S", privhfl.DCF_OPEN_A), "dcf"),
        (("S", "A1", privhfl.DCF_KEYS), "dcf"),
        (("A1", "S", privhfl.MATMUL_A), "dcf"),
        (("S", "A1", privhfl.BEAVER_S), "drelu"),
    ],
)
def test_a_malformed_message_is_blamed_on_its_sender_with_lent_buffers(target, relu) -> None:  # type: ignore[no-untyped-def]
    net, shape = tiny_models()["mlp"]
    model = from_torch(net.eval(), shape)
    x = np.random.default_rng(13).uniform(0, 1, (3, *shape))
    driver = LocalDriver(MessageBuffers(min_bytes=1, poison=0xEE))
    cfg = PrivHFLConfig(comparison=relu)
    res = driver.predict([model, model], x, cfg, tamper=_tamper(target, BAD["truncated"]))
    assert res.included == (0,) and set(res.dropped) == {1}
    again = driver.predict([model], x, cfg, seeds=seeds_from(np.random.default_rng(1)))
    assert again.included == (0,)  # the failed session's buffers were handed back
    with pytest.raises(QuerierMessageError):
        driver.predict([model], x, cfg, tamper=_tamper(("Q", "S", privhfl.SHARE), BAD["truncated"]))
