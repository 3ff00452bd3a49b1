"""PrivHFL over a message transport (flwr_fsl.families.privhfl.flow): the architecture codec
round-trips and is strict (fuzzed), the step schedule run with the answerer's state through its
byte codec between every step gives the plaintext logits within the fixed-point bound (every
layer type, torch models, several answerers summed), and malformed step messages raise a
ClientInputError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import WireFormatError, Writer
from flwr_fsl.families.privhfl.flow import (
    AnswererState,
    QuerierDeals,
    ServerSession,
    answerer_open,
    answerer_step,
    architecture_from_bytes,
    architecture_to_bytes,
    querier_messages,
    querier_session,
    querier_sign,
    schedule,
    unheld_seed,
)
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    Linear,
    ReLU,
    SecureModel,
    error_bound,
    from_torch,
    plaintext_forward,
    to_nhwc,
)
from flwr_fsl.families.privhfl.messages import (
    GenerateReply,
    SessionDeal,
    encode_generate_reply,
)
from flwr_fsl.families.privhfl.protocol import (
    PrivHFLConfig,
    PrivHFLMessageError,
    Querier,
    SessionSeeds,
    agg_step,
    server_aggregate,
)
from tests.families.privhfl.test_protocol import LAYER_CASES, random_model, tiny_models

CFG = PrivHFLConfig(comparison="dcf")


def run_flow(
    models: list[SecureModel],
    x: np.ndarray,
    session: int = 7,
    tamper_step: int | None = None,
    cfg: PrivHFLConfig = CFG,
) -> tuple[np.ndarray, tuple[int, ...], dict[int, str]]:
    """Q, S and every A_j exchange only bytes; A's state is re-decoded before every step."""
    rng = np.random.default_rng(5)
    seeds = [SessionSeeds(rng.bytes(16), rng.bytes(16), rng.bytes(16)) for _ in models]
    n = len(x)
    archs = [architecture_from_bytes(architecture_to_bytes(m.architecture)) for m in models]
    encoded = cfg.codec().encode(to_nhwc(np.asarray(x, dtype=np.float64)))
    parts: dict[int, np.ndarray] = {}
    dropped: dict[int, str] = {}
    ops = {}
    for j, model in enumerate(models):
        deals, ops[j] = querier_messages(cfg, archs[j], encoded, seeds[j], session)
        s_seeds = SessionSeeds(
            unheld_seed(seeds[j].server_answerer, seeds[j].server_querier),
            seeds[j].server_answerer,
            seeds[j].server_querier,
        )
        server = ServerSession(cfg, archs[j], n, s_seeds, session, deals)
        state = answerer_open(
            cfg, model, n, seeds[j].querier_answerer, seeds[j].server_answerer, session
        ).to_bytes()
        try:
            for k in range(1, len(server.steps)):
                sign = None
                if server.needs_querier(k):
                    sign = querier_sign(
                        cfg, archs[j], n, seeds[j], session, k, server.to_querier(k)
                    )
                out = server.to_answerer(k, sign)
                new, reply = answerer_step(cfg, model, AnswererState.from_bytes(state), k, out)
                if tamper_step == k and j == 0:
                    reply = reply[:-8]  # a truncated answerer reply
                state = new.to_bytes()
                server.from_answerer(k, reply)
            assert server.part is not None
            parts[j] = server.part
        except ClientInputError as err:
            dropped[j] = str(err)
    sessions = {
        j: querier_session(cfg, archs[j], n, seeds[j], session, ops[j]) for j in range(len(models))
    }
    q = Querier(cfg, sessions)
    q.prepare_aggregation()
    agg = server_aggregate(parts, agg_step(session))
    logits, included = q.finish(agg, agg_step(session), (n, archs[0].num_outputs))
    return logits, included, dropped


INTERACTIVE = sorted(c for c in LAYER_CASES if "avgpool" not in c)


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
@pytest.mark.parametrize("case", INTERACTIVE)
def test_every_layer_type_through_the_flow_matches_plaintext(case: str, relu: str) -> None:
    arch = LAYER_CASES[case]
    cfg = PrivHFLConfig(comparison=relu)  # type: ignore[arg-type]
    if relu == "drelu" and schedule(arch, 1)[1].kind == "compare":
        with pytest.raises(ConfigurationError, match="linear layer before"):
            run_flow(
                [random_model(arch, np.random.default_rng(3))],
                np.zeros((1, *arch.input_shape)),
                cfg=cfg,
            )
        return
    rng = np.random.default_rng(3)
    model = random_model(arch, rng)
    x = rng.uniform(-1, 1, (3, *arch.input_shape))
    logits, included, dropped = run_flow([model], x, cfg=cfg)
    assert included == (0,) and not dropped
    bound = error_bound(model, 1.0)
    assert np.max(np.abs(logits - plaintext_forward(model, x))) <= bound


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
def test_deals_made_one_at_a_time_fill_the_reply_with_the_joined_bytes(relu: str) -> None:
    # QuerierDeals announces every message's length before making it; the reply written
    # deal by deal is GenerateReply's join of querier_messages' list, byte for byte.
    cfg = PrivHFLConfig(comparison=relu)  # type: ignore[arg-type]
    cases = [
        c for c in INTERACTIVE if relu == "dcf" or schedule(LAYER_CASES[c], 1)[1].kind != "compare"
    ]
    sessions, joined, all_ops = [], [], []
    for j, case in enumerate(cases):
        arch = LAYER_CASES[case]
        encoded = cfg.codec().encode(to_nhwc(np.full((3, *arch.input_shape), 0.25)))
        seeds = SessionSeeds(bytes([j + 1]) * 16, bytes([j + 2]) * 16, bytes([j + 3]) * 16)
        messages, ops = querier_messages(cfg, arch, encoded, seeds, 9)
        deals = QuerierDeals(cfg, arch, encoded, seeds, 9)
        assert deals.sizes == tuple(len(m) for m in messages) and deals.ops is None
        sessions.append((100 + j, b"sealed-%d" % j, deals.sizes, deals))
        joined.append(SessionDeal(100 + j, b"sealed-%d" % j, tuple(messages)))
        all_ops.append(ops)
    data = encode_generate_reply(3, sessions)
    assert data == GenerateReply(3, tuple(joined)).to_bytes()
    assert GenerateReply.from_bytes(data) == GenerateReply(3, tuple(joined))
    assert [deals.ops for *_, deals in sessions] == all_ops
    with pytest.raises(ConfigurationError, match="made once"):
        list(sessions[0][3])


def test_streamed_reply_refuses_messages_that_break_their_announced_lengths() -> None:
    for sizes, messages, match in [
        ([3, 2], [b"abc", b"d"], "holds 1 bytes, announced 2"),
        ([3, 2], [b"abc"], "message 1: expected bytes, got NoneType"),
        ([3], [b"abc", b"de"], "more messages than the 1 announced"),
        ([3], ["abc"], "expected bytes, got str"),
        ([-1], [b""], "must be a u32"),
    ]:
        with pytest.raises(WireFormatError, match=match):
            encode_generate_reply(1, [(5, b"s", sizes, messages)])
    assert encode_generate_reply(1, [(5, b"s", [3, 0], iter([b"abc", b""]))]) == (
        GenerateReply(1, (SessionDeal(5, b"s", (b"abc", b"")),)).to_bytes()
    )


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=3),
    st.integers(1, 4),
    st.integers(0, 2**32 - 1),
    st.integers(0, 10_000),
)
def test_random_mlps_through_the_flow_match_plaintext(
    hidden: list[int], batch: int, session: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    sizes = [5, *hidden, 3]
    layers: list = []
    for i in range(len(sizes) - 1):
        layers += [Linear(sizes[i], sizes[i + 1]), ReLU()]
    arch = Architecture((5,), tuple(layers[:-1]))
    model = random_model(arch, rng)
    x = rng.uniform(-2, 2, (batch, 5))
    logits, included, _ = run_flow([model], x, session=session)
    assert included == (0,)
    assert np.max(np.abs(logits - plaintext_forward(model, x))) <= error_bound(model, 2.0)


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
def test_heterogeneous_torch_models_sum_through_the_flow(relu: str) -> None:
    nets = tiny_models()
    models = [from_torch(nets[k][0].eval(), (1, 8, 8)) for k in ("mlp", "cnn", "resnet")]
    x = np.random.default_rng(2).uniform(0, 1, (4, 1, 8, 8))
    logits, included, _ = run_flow(models, x, cfg=PrivHFLConfig(comparison=relu))  # type: ignore[arg-type]
    plain = sum(plaintext_forward(m, x) for m in models)
    assert included == (0, 1, 2)
    assert np.max(np.abs(logits - plain)) <= sum(error_bound(m, 1.0) for m in models)


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
def test_malformed_step_message_drops_only_that_answerer(relu: str) -> None:
    nets = tiny_models()
    models = [from_torch(nets[k][0].eval(), (1, 8, 8)) for k in ("mlp", "mlp")]
    x = np.random.default_rng(2).uniform(0, 1, (2, 1, 8, 8))
    cfg = PrivHFLConfig(comparison=relu)  # type: ignore[arg-type]
    logits, included, dropped = run_flow(models, x, tamper_step=2, cfg=cfg)
    assert included == (1,) and set(dropped) == {0}
    assert np.max(np.abs(logits - plaintext_forward(models[1], x))) <= error_bound(models[1], 1.0)


def test_local_only_architecture_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        schedule(LAYER_CASES["avgpool"], 1)


def test_step_out_of_order_is_refused() -> None:
    model = from_torch(tiny_models()["mlp"][0].eval(), (1, 8, 8))
    state = answerer_open(CFG, model, 2, bytes(range(16)), bytes(16), 1)
    with pytest.raises(PrivHFLMessageError):
        answerer_step(CFG, model, state, 2, b"")
    with pytest.raises(ClientInputError):
        answerer_step(CFG, model, state, 1, b"garbage")


# ------------------------------------------------------------------------------- codecs


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_architecture_codec_round_trips(case: str) -> None:
    arch = LAYER_CASES[case]
    data = architecture_to_bytes(arch)
    back = architecture_from_bytes(data)
    assert architecture_to_bytes(back) == data
    assert back.input_shape == arch.input_shape and back.counts() == arch.counts()
    for cut in (len(data) - 1, 5):
        with pytest.raises(WireFormatError):
            architecture_from_bytes(data[:cut])
    with pytest.raises(WireFormatError):
        architecture_from_bytes(data + b"\x00")


def test_architecture_codec_refuses_invalid_architectures() -> None:
    good = architecture_to_bytes(Architecture((6,), ()))
    with pytest.raises(WireFormatError):
        architecture_from_bytes(good[:-4] + (1).to_bytes(4, "little") + b"\x63")  # unknown tag
    # a Linear whose input does not chain: (6,) -> Linear(5, 2)
    bad = good[:-4] + (1).to_bytes(4, "little") + b"\x01" + (5).to_bytes(4, "little")
    bad += (2).to_bytes(4, "little") + b"\x01"
    with pytest.raises(WireFormatError, match="invalid architecture"):
        architecture_from_bytes(bad)
    with pytest.raises(WireFormatError):
        architecture_from_bytes(b"PHAR\x02")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 200))
def test_fuzzed_architecture_and_state_parse_or_raise(noise: bytes, at: int) -> None:
    arch = architecture_to_bytes(LAYER_CASES["residual-conv-shortcut"])
    model = from_torch(tiny_models()["mlp"][0].eval(), (1, 8, 8))
    state = answerer_open(CFG, model, 1, bytes(range(16)), bytes(16), 0).to_bytes()
    for data in (arch, state, noise):
        mutated = data[:at] + noise + data[at + len(noise) :]
        for decode in (architecture_from_bytes, AnswererState.from_bytes):
            try:
                decode(mutated)
            except ClientInputError:
                pass


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6), st.integers(0, 5))
def test_fuzzed_state_shapes_raise_client_input_errors_only(dims: list[int], zero: int) -> None:
    # Issue 24: a shape word of 2**62 or more on an empty array made numpy's reshape raise
    # ValueError (2 of 20,000 fuzz cases); every bad shape is now a WireFormatError.
    shape = list(dims)
    shape[zero % len(shape)] = 0  # an empty array: any other dimension passes the size check
    empty = np.zeros(0, dtype=np.uint64)
    data = AnswererState(1, 2, 1, 0, bytes(16), bytes(16), [empty]).to_bytes()
    w = Writer()
    w.array(empty)
    head = len(data) - len(w.payload()) - 12  # the shape: count u32 and one u64 id
    new = len(shape).to_bytes(4, "little") + b"".join(d.to_bytes(8, "little") for d in shape)
    mutated = data[:head] + new + data[head + 12 :]
    try:
        back = AnswererState.from_bytes(mutated)
    except ClientInputError:
        return
    assert back.stack[0].shape == tuple(shape) and max(shape) <= 1 << 20


def test_state_round_trips_with_pool_and_residual_stacks() -> None:
    rng = np.random.default_rng(0)
    st_ = AnswererState(
        3, 2, 4, 9, rng.bytes(16), rng.bytes(16),
        [rng.integers(0, 2**63, (2, 3, 3, 4), dtype=np.uint64)] * 2,
        (rng.integers(0, 2**63, (2, 2, 3, 3, 4), dtype=np.uint64),
         np.zeros((0, 2, 3, 3, 4), dtype=np.uint64)),
    )  # fmt: skip
    back = AnswererState.from_bytes(st_.to_bytes())
    assert back.to_bytes() == st_.to_bytes()
    assert back.pool is not None and back.pool[1].shape == (0, 2, 3, 3, 4)
    with pytest.raises(WireFormatError):
        AnswererState.from_bytes(st_.to_bytes()[:-1])
