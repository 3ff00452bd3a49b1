"""What one request may cost the helper server S1: limits checked before anything is allocated.

A round's public parameters (:class:`~flwr_fsl.families.ssa.protocol.SSAParams`, a few hundred
bytes)
decide how much memory and CPU S1 spends on it, so without limits one small ``OpenRound`` with
a large ``domain_size`` or ``value_width`` drives S1 out of memory, and one ``AddClients`` with
many clients holds S1 busy for minutes. :class:`HelperLimits` bounds both; every check runs on
the parameters alone (integer arithmetic, no array allocated) and refuses the whole call with a
:class:`~flwr_fsl.helper.errors.HelperRequestError` naming the limit and the
``flwr-fsl-helper`` flag that raises it. A refused call leaves S1's state unchanged; other
sessions never notice.

**Memory of one round** (8-byte words; ``m`` = ``domain_size``, ``w`` = ``value_width``,
``τ = w + count_weighted``, ``η`` = ``num_hashes``, ``σ`` = ``stash_size``, ``B`` bins,
``K = B + σ`` keys per client, ``P = (η + σ) m`` points one client's keys are evaluated on —
a simple bin holds each index at most ``η`` times, a stash key covers all of ``[0, m)``),
read off what S1 allocates in :class:`~flwr_fsl.families.ssa.protocol.SSAServer`,
:func:`~flwr_fsl.families.ssa.protocol.simple_table_for`,
:class:`~flwr_fsl.families.ssa.psr.PSRServer`
and the DPF evaluation they call (``S = 5 · 2**16``: its fixed level buffers)::

    held  = m τ                          the round's share (SSAServer)
          + η m + B + 1 + K              the simple table (bin items, offsets), key lengths
          [+ m w]                        the PSR table, once SetModel gave one
    peak  = max( (1 + 2η) m              building the simple table: all indices, their η
                 + 2η min(m, 2**14),     candidate bins, a scratch array, AES blocks
                 P τ [+ P τ] + [σ>0] m τ evaluating clients' keys (AddClients or a hint;
                 [+ P τ] + 32 K + S,     one client at a time into one reused buffer; if
                                         ``8 P τ`` <= 64 MiB, their sum in key order,
                                         scattered into the share when it is read; a
                                         streamed checked round with the exact value check
                                         holds two clients' shares) and summing their
                                         stash slots
                 max(2 m τ, [P τ]),      FinishRound: the deferred sum's scatter, then the
                                         share's copy and its response
                 [P + K w + [σ>0] m w    answering one PSR query: selectors, answer rows,
                  + 32 K + S] )          stash products (with a table)

:func:`round_words` is ``held + peak``; ``OpenRound`` (without a table) and ``SetModel`` (with)
refuse a round whose bytes exceed ``max_round_bytes``. On top come the bytes S0 sends (each
request and what is parsed from it, bounded by the gRPC message limit; S0 relays a round's
uploads in chunks of 64 MiB by default, so a round of any size is many small requests) and,
in U-DPF rounds only (``epoch >= 1``), clients' keys: S1 keeps each accepted client's key
batch (about the size of its public part) until the round ends and then in the session;
``max_clients_per_round`` bounds how many per round. A one-shot round (epoch 0) frees each
client's keys once they are added, so its memory does not grow with its clients. The bound is
checked against the real peak, traced with :mod:`tracemalloc`, in
``tests/helper/test_helper_limits.py``.

**Work of one round** (words S1 computes or reads): ``P τ`` per client (AddClients or a U-DPF
hint: one full-domain evaluation of its keys) and ``P (1 + w)`` per PSR query (its selectors and
the inner products with the table); ``AddClients``, ``AddClientHints`` and ``PsrAnswer`` admit
a request only if the round's total stays within ``max_round_work`` and its clients (uploads,
and separately queries) within ``max_clients_per_round`` — before any client is evaluated.
S1 evaluates some 3–5·10^7 words/s per core here, so the default ``2**35`` is 10–20 minutes
of one core per round.

The defaults allow ``m = 2**20`` single-coordinate rounds (~194 MiB, ~202 MiB with PSR; 2730
clients with a query and an upload each), embedding tables like MovieLens' (~74k rows × 64:
~161 MiB, ~197 MiB with PSR; 1190 such clients), ``m = 2**23`` at width 1, and every test and
example here; an operator raises them with the CLI flags (:mod:`flwr_fsl.helper.cli`), the
in-process S1 with ``InProcessHelper(limits=HelperLimits(...))``.

**Differential privacy policy** (``HelperLimits.dp``, flags ``--dp-noise-multiplier``,
``--dp-clip-norm``, ``--dp-max-weight``; :mod:`flwr_fsl.families.ssa.dp`). S1's noise is what
protects the clients against S0, so S1 decides it, not S0: with a policy set, S1 refuses at
``OpenRound`` a round without DP parameters (its clients would not clip, so no noise could be
calibrated), one whose ``clip_norm`` / ``max_weight`` exceed S1's, and one whose noise
multiplier is below S1's (S1 never accepts less noise than its floor, and never silently adds
more than the round says, so both servers' accounts and the clients' checks see one ``z``).
Without a policy S1 adds the noise a DP round asks for. ``dp_budget`` (``--dp-budget-epsilon``,
``--dp-budget-delta``) is S1's ceiling on every run's privacy account
(:mod:`flwr_fsl.helper.accounts`); ``dp_client_budget`` (``--dp-client-budget-epsilon``) its
ceiling on every enrolled client's account across runs (:mod:`flwr_fsl.helper.client_accounts`).

**Value check** (``HelperLimits.min_value_check``, flag ``--min-value-check``; issue 21). S0
chooses a round's parameters, so S1 insists on its own floor: it refuses at ``OpenRound`` a
round whose :attr:`~flwr_fsl.families.ssa.messages.SSAParams.value_check` checks less
(``off < projected < exact``; unchecked rounds, ``verify`` False, count as ``off``), and a
projected round with fewer than ``min_projections`` projections (flag ``--min-projections``,
default :data:`~flwr_fsl.families.ssa.messages.DEFAULT_PROJECTIONS`, 64: each projection halves
a forger's chance, so ``r`` projections let a word past ``2T`` through with probability
``2^-r`` per try). ``flwr-fsl-helper`` defaults to ``projected``;
the dataclass defaults to ``off`` because the in-process S1
(:class:`~flwr_fsl.helper.InProcessHelper`) runs inside S0's process, where S0 controls it
anyway and a floor protects nobody (pass ``HelperLimits(min_value_check=...)`` to test one).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, fields

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.crypto.dpf import MAX_TAU
from flwr_fsl.crypto.fixedpoint import FixedPointOverflowError
from flwr_fsl.families.ssa.dp import DistributedDP, check_headroom, noise_std
from flwr_fsl.families.ssa.messages import DEFAULT_PROJECTIONS, MAX_PROJECTIONS, VALUE_CHECKS
from flwr_fsl.families.ssa.protocol import DEFERRED_SCATTER_MAX_BYTES, SSAParams
from flwr_fsl.helper.errors import HelperRequestError

__all__ = [
    "MAX_PARAMS_BYTES",
    "HelperLimits",
    "RoundBudget",
    "query_work",
    "round_words",
    "upload_work",
]

MAX_PARAMS_BYTES = 4096
"""Longest ``OpenRound`` parameter set S1 parses (a real one is about 350 bytes of JSON)."""

_KEY_WORDS = 32  # per-key bookkeeping of one evaluation: seeds, lengths, offsets, tasks
_EVAL_SCRATCH = 5 << 16  # evaluate_batch's four (2**15 + 1, 2) level buffers and control bits
_HASH_CHUNK = 1 << 14  # simple hashing encrypts (2**14, η, 2)-word blocks at a time
_PROOF_WORDS = 8  # a checked round's leaf proof per evaluated point (kernels.vdpf_kernels)
# Work of a checked point's proof in words of evaluation: ssa_bench measures a checked client at
# about 2.3x an unchecked one at tau = 2 (4 more AES blocks and a hash per point), i.e. +3 words.
_PROOF_WORK = 3
_PROOF_SEGMENT = 1 << 16  # points per proof segment (flwr_fsl.families.ssa.verify)
_MAX_DOMAIN = 1 << 62  # the hashing layer's own maximum
_MAX_WIDTH = MAX_TAU - 1  # tau = width + count word must fit a DPF
_MAX_COUNT = 1 << 62
_MAX_TOPS = {"max_value_width": _MAX_WIDTH, "min_projections": MAX_PROJECTIONS}


def round_words(params: SSAParams, *, table: bool = False) -> int:
    """Upper bound of the words S1 holds at once for a round (see the module docstring).

    Parameters
    ----------
    params : SSAParams
        The round (only public, already validated fields are read; nothing is allocated).
    table : bool
        Include a PSR table (``SetModel``) and answering one query.

    Returns
    -------
    int
        ``held + peak`` in 8-byte words.
    """
    m, w, tau = params.domain_size, params.value_width, params.tau
    eta, sigma = params.num_hashes, params.stash_size
    bins = params.hash_params.num_bins
    keys = bins + sigma
    points = (eta + sigma) * m
    held = m * tau + eta * m + bins + 1 + keys
    ktau = params.key_tau
    if params.verify:  # key check: two proof buffers (one segment, or a stash key), discard row
        segment = max(_PROOF_SEGMENT, m + 1 if sigma else 0)
        held += 2 * segment * _PROOF_WORDS + tau
    build = (1 + 2 * eta) * m + 2 * eta * min(m, _HASH_CHUNK)
    # While clients are added: the reused evaluation buffer and, up to 64 MiB, the clients'
    # summed shares in key order (scattered into the share when it is read, then freed).
    evaluated = (points + (keys if params.verify else 0)) * ktau  # a checked key's dummy slot
    deferred = evaluated if 8 * evaluated <= DEFERRED_SCATTER_MAX_BYTES else 0
    # A streamed checked round holds two clients' evaluations at once; only the exact value
    # check keeps each one's shares (otherwise a segment's rows per thread, less than one).
    kept = 2 if params.verify and params.value_check_mode == "exact" else 1
    evaluate = kept * evaluated + deferred + (m * ktau if sigma else 0)
    evaluate += _KEY_WORDS * keys + _EVAL_SCRATCH
    finish = max(2 * m * tau, deferred)
    peak = max(build, evaluate, finish)
    if table:
        held += m * w
        answer = points + keys * w + (m * w if sigma else 0) + _KEY_WORDS * keys + _EVAL_SCRATCH
        peak = max(peak, answer)
    return held + peak


def upload_work(params: SSAParams) -> int:
    """Words S1 evaluates for one client's keys (fresh or U-DPF): ``P τ`` (and P proofs).

    In a checked round each of the ``P`` points also gets a leaf proof, counted as
    ``_PROOF_WORK`` words of work (measured, see the constant).
    """
    per_point = params.key_tau + (_PROOF_WORK if params.verify else 0)
    return (params.num_hashes + params.stash_size) * params.domain_size * per_point


def query_work(params: SSAParams) -> int:
    """Words S1 computes or reads to answer one PSR query: ``P (1 + w)``."""
    points = (params.num_hashes + params.stash_size) * params.domain_size
    return points * (1 + params.value_width)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


@dataclass(frozen=True)
class HelperLimits:
    """What one round may cost S1 (see the module docstring for the formulas).

    Parameters
    ----------
    max_domain_size : int (default: 2**24)
        Largest ``domain_size`` ``m`` (``--max-domain``).
    max_value_width : int (default: 4096)
        Largest ``value_width`` (``--max-width``).
    max_num_items : int (default: 2**22)
        Largest ``num_items`` ``k`` (``--max-items``).
    max_round_bytes : int (default: 1 GiB)
        Largest :func:`round_words` of a round (with its PSR table, if any) in bytes
        (``--max-round-mib``).
    max_clients_per_round : int (default: 10000)
        Clients one round may take: uploads (fresh or hints) and, separately, PSR queries
        (``--max-clients-per-round``).
    max_round_work : int (default: 2**35)
        Words one round may evaluate or read over all its clients and queries
        (``--max-round-gwords``, in units of 2**30).
    min_clients : int (default: 2)
        S1's own minimum participation (``--min-clients``): S1 refuses to return its share of
        a round with fewer clients, whatever S0 asks, so S0 alone cannot isolate a client.
    dp : DistributedDP or None (default: None)
        S1's differential-privacy policy (``--dp-noise-multiplier``, ``--dp-clip-norm``,
        ``--dp-max-weight``; see the module docstring): its noise multiplier is a floor, its
        clip norm and weight bound are the most a round may ask clients to clip to.
    dp_budget : PrivacyBudget or None (default: None)
        S1's ceiling on every run's privacy account (``--dp-budget-epsilon``,
        ``--dp-budget-delta``): S1 refuses a round past it whatever budget S0 announces.
    dp_client_budget : PrivacyBudget or None (default: None)
        S1's ceiling on every client's own account across runs
        (``--dp-client-budget-epsilon``, ``--dp-client-budget-delta``): S1 refuses, per
        client, one whose account a DP round would take past it.
    min_value_check : str (default: "off"; ``flwr-fsl-helper``: "projected")
        The least value check S1 accepts in a round (``--min-value-check``; one of
        ``"off"``, ``"projected"``, ``"exact"``, weakest first): see the module docstring.
    min_projections : int (default: 64)
        The fewest projections S1 accepts in a projected round (``--min-projections``; in
        ``[1, 1024]``): a round with fewer is refused, naming the flag.

    Raises
    ------
    ValueError
        If a value is not an integer in ``[1, maximum]`` (``2**62`` for sizes and counts,
        ``2**20 - 2`` for the width), or ``dp`` is not a :class:`DistributedDP`.
    """

    max_domain_size: int = 1 << 24
    max_value_width: int = 1 << 12
    max_num_items: int = 1 << 22
    max_round_bytes: int = 1 << 30
    max_clients_per_round: int = 10_000
    max_round_work: int = 1 << 35
    min_clients: int = 2
    dp: DistributedDP | None = None
    dp_budget: PrivacyBudget | None = None
    dp_client_budget: PrivacyBudget | None = None
    min_value_check: str = "off"
    min_projections: int = DEFAULT_PROJECTIONS

    def __post_init__(self) -> None:
        if self.min_value_check not in VALUE_CHECKS:
            raise ConfigurationError(
                f"min_value_check must be one of {VALUE_CHECKS}, got {self.min_value_check!r}"
            )
        if self.dp is not None and not isinstance(self.dp, DistributedDP):
            raise ConfigurationError(f"dp must be a DistributedDP, got {type(self.dp).__name__}")
        for name in ("dp_budget", "dp_client_budget"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, PrivacyBudget):
                raise ConfigurationError(
                    f"{name} must be a PrivacyBudget, got {type(value).__name__}"
                )
        for f in fields(self):
            if f.name in ("dp", "dp_budget", "dp_client_budget", "min_value_check"):
                continue
            value = getattr(self, f.name)
            top = _MAX_TOPS.get(f.name, _MAX_COUNT)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ConfigurationError(
                    f"{f.name} must be an integer in [1, {top}], got {value!r}"
                )

    def check_participation(self, round_id: int, clients: int) -> None:
        """Refuse to finish a round with fewer than ``min_clients`` clients (none is harmless).

        Raises
        ------
        HelperRequestError
            If the round has too few clients (S1 keeps nothing of it).
        """
        if 0 < clients < self.min_clients:
            raise HelperRequestError(
                f"round {round_id}: {clients} clients, fewer than S1's minimum participation "
                f"{self.min_clients} (flwr-fsl-helper --min-clients); no share is returned"
            )

    def noise_multiplier(self, params: SSAParams) -> float | None:
        """Return the noise multiplier S1 uses in a round (None: the round has no DP).

        Raises
        ------
        HelperRequestError
            If S1 has a DP policy and the round has no DP parameters, asks for less noise
            than S1's floor or asks clients to clip to more than S1 allows (naming the flag),
            or the noise does not fit the ring.
        """
        rid, policy = params.round_id, self.dp
        if params.dp is None:
            if policy is not None:
                raise HelperRequestError(
                    f"round {rid} has no DP parameters, but S1 adds noise to every round "
                    "(flwr-fsl-helper --dp-noise-multiplier): its clients would not clip"
                )
            return None
        z = params.dp.noise_multiplier
        if policy is not None:
            for value, limit, name, flag in (
                (params.dp.clip_norm, policy.clip_norm, "clip_norm", "--dp-clip-norm"),
                (params.dp.max_weight, policy.max_weight, "max_weight", "--dp-max-weight"),
            ):
                if value > limit:
                    raise HelperRequestError(
                        f"round {rid}: dp {name} {value:g} exceeds S1's {limit:g} "
                        f"(flwr-fsl-helper {flag}): S1's noise would not cover it"
                    )
            if z < policy.noise_multiplier:
                raise HelperRequestError(
                    f"round {rid}: dp noise_multiplier {z:g} is below S1's floor "
                    f"{policy.noise_multiplier:g} (flwr-fsl-helper --dp-noise-multiplier)"
                )
        sigma = noise_std(params.dp, params.num_items, params.value_width, params.frac_bits, z)
        try:
            check_headroom(params.fixed_point, sigma)
        except FixedPointOverflowError as err:
            raise HelperRequestError(f"round {rid}: {err}") from None
        return z

    def check_value_check(self, params: SSAParams) -> None:
        """Refuse a round whose value check is weaker than ``min_value_check``.

        Raises
        ------
        HelperRequestError
            Naming the round's check, S1's floor and the flag.
        """
        check = params.value_check_mode
        if check == "projected" and params.projections < self.min_projections:
            raise HelperRequestError(
                f"round {params.round_id}: the projected value check has {params.projections} "
                f"projections, fewer than S1's {self.min_projections} (flwr-fsl-helper "
                "--min-projections; each halves a forger's chance)"
            )
        if VALUE_CHECKS.index(check) < VALUE_CHECKS.index(self.min_value_check):
            raise HelperRequestError(
                f"round {params.round_id}: value_check {check!r} checks less than S1's floor "
                f"{self.min_value_check!r} (flwr-fsl-helper --min-value-check): a malicious "
                "client could move an element's sum unchecked"
            )

    def check_params_bytes(self, size: int) -> None:
        """Refuse an ``OpenRound`` parameter set longer than :data:`MAX_PARAMS_BYTES`.

        Raises
        ------
        HelperRequestError
            If ``size`` is too large (before it is parsed).
        """
        if size > MAX_PARAMS_BYTES:
            raise HelperRequestError(
                f"bad round parameters: {size} bytes, S1 parses at most {MAX_PARAMS_BYTES}"
            )

    def open_round(self, params: SSAParams) -> RoundBudget:
        """Check a round's parameters; return its budget (nothing allocated either way).

        Parameters
        ----------
        params : SSAParams
            The parsed parameters of an ``OpenRound``.

        Returns
        -------
        RoundBudget
            The round's account, to keep with the round.

        Raises
        ------
        HelperRequestError
            Naming the first limit the round exceeds and the flag that raises it.
        """
        rid = params.round_id
        for value, limit, name, flag in (
            (params.domain_size, self.max_domain_size, "domain_size", "--max-domain"),
            (params.value_width, self.max_value_width, "value_width", "--max-width"),
            (params.num_items, self.max_num_items, "num_items", "--max-items"),
        ):
            if value > limit:
                raise HelperRequestError(
                    f"round {rid}: {name} {value} exceeds S1's limit {limit} "
                    f"(flwr-fsl-helper {flag})"
                )
        self.check_value_check(params)
        noise = self.noise_multiplier(params)
        budget = RoundBudget(self, params, memory=8 * round_words(params), noise_multiplier=noise)
        budget.check_memory("the round")
        budget.check_one(upload_work(params), "one client's keys")
        return budget


@dataclass
class RoundBudget:
    """One open round's account against :class:`HelperLimits` (kept in the round's state).

    Attributes
    ----------
    limits : HelperLimits
        The limits.
    params : SSAParams
        The round.
    memory : int
        Bytes charged (:func:`round_words`, with ``table=True`` once ``SetModel`` set one).
    work : int
        Words admitted so far (uploads and queries).
    noise_multiplier : float or None
        The DP noise multiplier S1 adds to its share (None: no DP;
        :meth:`HelperLimits.noise_multiplier`).
    """

    limits: HelperLimits
    params: SSAParams
    memory: int
    work: int = 0
    noise_multiplier: float | None = None

    def check_memory(self, what: str) -> None:
        """Refuse if :attr:`memory` exceeds ``max_round_bytes``.

        Raises
        ------
        HelperRequestError
            Naming the estimate, the limit and ``--max-round-mib``.
        """
        if self.memory > self.limits.max_round_bytes:
            p = self.params
            raise HelperRequestError(
                f"round {p.round_id}: {what} would need about {_mib(self.memory)} on S1 "
                f"(domain_size {p.domain_size}, value_width {p.value_width}, tau {p.tau}, "
                f"{p.num_hashes} hashes, stash {p.stash_size}, {p.num_keys} keys), over S1's "
                f"limit of {_mib(self.limits.max_round_bytes)} (flwr-fsl-helper --max-round-mib)"
            )

    def check_one(self, work: int, what: str) -> None:
        """Refuse a round in which not even one client or query fits ``max_round_work``.

        Raises
        ------
        HelperRequestError
            If ``work`` alone exceeds the limit.
        """
        if work > self.limits.max_round_work:
            raise HelperRequestError(
                f"round {self.params.round_id}: {what} alone would cost {work} words of work, "
                f"over S1's per-round limit {self.limits.max_round_work} "
                "(flwr-fsl-helper --max-round-gwords)"
            )

    def add_table(self) -> None:
        """Charge a PSR table (``SetModel``) and one query's answer buffers.

        Raises
        ------
        HelperRequestError
            If the round's memory would exceed ``max_round_bytes`` or one query alone exceeds
            ``max_round_work``; nothing is charged then.
        """
        before = self.memory
        self.memory = 8 * round_words(self.params, table=True)
        try:
            self.check_memory("the round with its PSR table")
            self.check_one(query_work(self.params), "one PSR query")
        except HelperRequestError:
            self.memory = before
            raise

    def admit(self, method: str, seen: Set[int], client_ids: Iterable[int], *, query: bool) -> None:
        """Admit a request's clients before any of them is evaluated.

        Parameters
        ----------
        method : str
            The call (for the message).
        seen : set of int
            Client ids that already submitted (uploads) or queried in this round; ids in it
            are rejected per client later and cost nothing here.
        client_ids : iterable of int
            The request's client ids.
        query : bool
            PSR queries (:func:`query_work` each) instead of uploads (:func:`upload_work`).

        Raises
        ------
        HelperRequestError
            If the round would exceed ``max_clients_per_round`` or ``max_round_work``; nothing
            is charged then.
        """
        new = len(set(client_ids) - seen)
        clients = len(seen) + new
        rid, limits = self.params.round_id, self.limits
        kind = "PSR queries" if query else "clients"
        if clients > limits.max_clients_per_round:
            raise HelperRequestError(
                f"{method} would bring round {rid} to {clients} {kind}, over S1's limit "
                f"{limits.max_clients_per_round} (flwr-fsl-helper --max-clients-per-round)"
            )
        work = self.work + new * (query_work(self.params) if query else upload_work(self.params))
        if work > limits.max_round_work:
            raise HelperRequestError(
                f"{method} would bring round {rid} to {work} words of work ({clients} {kind}), "
                f"over S1's per-round limit {limits.max_round_work} "
                "(flwr-fsl-helper --max-round-gwords)"
            )
        self.work = work
