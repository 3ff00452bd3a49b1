"""``flwr-fsl-helper``: run the helper server S1 as its own process.

Usage::

    flwr-fsl-helper --host 127.0.0.1 --port 9500 --key-file s1.pem --generate-key
    python -m flwr_fsl.helper ...   # the same, without the console script

On start it loads its X25519 key pair from ``--key-file`` (with ``--generate-key``, a missing
file is created with mode 0600; without it, a missing file is an error), prints::

    flwr-fsl-helper: public key fingerprint <64 hex digits>
    flwr-fsl-helper: listening on <host>:<port>

(the second line only once the server accepts calls; with ``--port 0`` it shows the port
picked) and serves until SIGINT or SIGTERM, then stops gracefully and exits 0. Pin the
fingerprint in the run config of S0 (which checks it with
:func:`~flwr_fsl.helper.connection.verify_helper`) and hand it to clients out of band.
``--print-fingerprint`` prints the fingerprint of the key file and exits.

**Authentication** (on by default; :mod:`flwr_fsl.helper.server`). Every call but ``Health``
and ``PublicKey`` must carry an access token: ``--token-file PATH`` names it (file content,
stripped; mode 0600), otherwise S1 uses ``<state-dir>/token``, creating it (a random 256-bit
token, mode 0600) on first start, and prints::

    flwr-fsl-helper: access token file <path>

S0 passes it with the run-config key ``ssa-helper-token-file`` (the absolute path of a copy of
that file on S0's machine). ``--insecure`` serves without a token unless ``--token-file`` is
given. ``--tls-cert`` and ``--tls-key`` serve TLS (S0 sets ``ssa-helper-ca-file``); on a
non-loopback ``--host`` they are required, since the token and the session secrets would
otherwise travel in clear, unless ``--insecure`` is given. Each session's calls also carry the
secret S1 returned when S0 opened it (:mod:`flwr_fsl.helper.service`).

**Limits** (:mod:`flwr_fsl.helper.limits`; a round over one is refused before S1 allocates
anything, with an error naming the flag): ``--max-domain`` (``domain_size``), ``--max-width``
(``value_width``), ``--max-items`` (``num_items``), ``--max-round-mib`` (memory of one round:
share, hashing table, one client's evaluation, PSR table), ``--max-clients-per-round`` and
``--max-round-gwords`` (work of one round over all its clients, in ``2**30`` words), and
``--min-clients`` (S1's own minimum participation, default 2: it returns no share of a round
with fewer clients, so S0 alone cannot isolate one). Bad values
are refused up front, naming the flag. ``--min-value-check`` (default ``projected``) refuses
SSA rounds whose value-word check is weaker (``off < projected < exact``; issue 21), and
``--min-projections`` (default 64) projected rounds with fewer random projections.

**Resources** (:mod:`flwr_fsl.helper.quota`; a call over one is refused, ``RESOURCE_EXHAUSTED``,
naming the flag, before S1 allocates anything): ``--max-memory-mib`` (S1's memory budget over
all sessions, default 8192), ``--max-session-mib`` (one session, default 2048),
``--session-reserve-mib`` (guaranteed to every open session, default 64),
``--max-sessions`` (default 64), ``--max-sessions-per-peer`` (from one address, default 16),
``--max-open-rounds`` (per session, default 4), ``--max-calls-per-session`` (running or
queued, default 2), ``--session-idle-s`` (a session without a call and without an open round
is dropped after it, default 300), ``--round-idle-s`` (with an open round, default 3600) and
``--evict-idle-s`` (an idle session may be evicted for a new one when the table is full,
default 30). ``--workers`` (default: one thread per call the sessions may make) caps the
session calls at once; ``Health`` and ``PublicKey`` have threads of their own.

**Differential privacy** (:mod:`flwr_fsl.families.ssa.dp`): ``--dp-noise-multiplier Z
--dp-clip-norm C --dp-max-weight W`` (all three, or none; ``--dp-delta`` for the logged
account, default 1e-5) make S1 add Gaussian noise of std ``Z · Δ`` to its share of every round
and refuse rounds without DP parameters, with a noise multiplier below ``Z`` (a floor: S1 never
accepts less) or with a clip norm or weight bound above ``C`` / ``W``. Without them S1 adds
the noise each DP round asks for.

**Privacy accounts** (:mod:`flwr_fsl.helper.accounts`): S1 keeps its own account of every
run's DP rounds (the guarantee against S0), keyed by the run id the round's parameters name
(S0 sends the Flower run id; clients check it), in ``--state-dir`` (default
``$FLWR_HOME/fsl/helper-state``, ``FLWR_HOME`` defaulting to ``~/.flwr``), one file per run,
so a restart or a new session resumes it. S1 refuses a round that would take a run past the
budget S0 announces for it, or past S1's own ceiling ``--dp-budget-epsilon E``
(``--dp-budget-delta``; default ``ε = 20`` at ``δ = 1e-5``, the strategies' default budget)
whatever S0 announces. ``--dp-client-budget-epsilon E`` (``--dp-client-budget-delta``; the
same default) caps each enrolled client's own account across all runs
(:mod:`flwr_fsl.helper.client_accounts`, in the same state directory): a client a DP round
would take past it is refused for that round, so a fresh run is no fresh budget.

**Client identities** (:mod:`flwr_fsl.crypto.identity`): ``--enrollment FILE`` names the
enrollment list, one client Ed25519 public key per line (``<64 hex digits> [label]``, ``#``
comments); S1 accepts SSA uploads and U-DPF hints only when signed by one of them, once per
round, and counts distinct enrolled signers for ``--min-clients``. It is required unless
``--open-enrollment`` is given (insecure: any signer is accepted, so a deviating S0 can invent
clients; for tests and trusted setups). Each client node makes its key and prints its line with
``flwr-fsl-identity KEYFILE --generate --label NAME`` (``python -m flwr_fsl.crypto.identity``)
and passes the key file's path to its SuperNode as ``--node-config fsl-signing-key=...``.

Exit codes: 0 after a clean stop, 2 for bad arguments or an unusable key or token file, 1 when
the address cannot be bound.

**Threat model.** As :mod:`flwr_fsl.helper.service`. The key file and the token file are S1's
secrets: keep them readable by S1's user only (the loaders refuse group/other access). Without
``--insecure``, a caller without the token reaches only ``Health`` and ``PublicKey``; a caller
with it cannot touch another S0's session (each has its own secret).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.crypto.channel import SealedBoxError
from flwr_fsl.crypto.identity import Enrollment, load_enrollment
from flwr_fsl.families.ssa.dp import DEFAULT_BUDGET, DistributedDP
from flwr_fsl.families.ssa.messages import DEFAULT_PROJECTIONS, MAX_PROJECTIONS
from flwr_fsl.helper import wire
from flwr_fsl.helper.connection import is_loopback
from flwr_fsl.helper.limits import HelperLimits
from flwr_fsl.helper.memory import bound_allocator
from flwr_fsl.helper.quota import ServiceLimits
from flwr_fsl.helper.server import format_address, start_server
from flwr_fsl.helper.service import HelperService
from flwr_fsl.helper.setup import load_or_create_key

__all__ = ["TOKEN_FILE_NAME", "default_state_dir", "main"]

TOKEN_FILE_NAME = "token"
"""The access token's file in ``--state-dir`` when ``--token-file`` is not given."""

_PROG = "flwr-fsl-helper"
_MIB = 1 << 20
_GWORDS = 1 << 30
_DEFAULT_LIMITS = HelperLimits()

# flag -> (ServiceLimits field, unit the flag counts in (0: seconds, a float), help text)
_QUOTA_FLAGS: dict[str, tuple[str, int, str]] = {
    "--max-memory-mib": ("max_memory_bytes", _MIB, "S1's memory budget over all sessions, MiB"),
    "--max-session-mib": ("max_session_bytes", _MIB, "memory one session may hold, MiB"),
    "--session-reserve-mib": (
        "session_reserve_bytes",
        _MIB,
        "memory guaranteed to every open session, MiB",
    ),
    "--max-sessions": ("max_sessions", 1, "sessions (runs) served at once"),
    "--max-sessions-per-peer": ("max_sessions_per_peer", 1, "sessions at once from one address"),
    "--max-open-rounds": ("max_open_rounds", 1, "rounds open at once per session"),
    "--max-calls-per-session": (
        "max_calls_per_session",
        1,
        "calls of one session running or queued at once",
    ),
    "--session-idle-s": (
        "session_idle_s",
        0,
        "drop a session without an open round after this many seconds without a call",
    ),
    "--round-idle-s": (
        "round_idle_s",
        0,
        "drop a session with an open round after this many seconds without a call",
    ),
    "--evict-idle-s": (
        "evict_idle_s",
        0,
        "a session idle this long (no open round) may be evicted when the table is full",
    ),
}
_DEFAULT_QUOTA = ServiceLimits()

# flag -> (HelperLimits field, unit the flag counts in, help text)
_LIMIT_FLAGS: dict[str, tuple[str, int, str]] = {
    "--max-domain": ("max_domain_size", 1, "largest round domain_size m"),
    "--max-width": ("max_value_width", 1, "largest round value_width (row width)"),
    "--max-items": ("max_num_items", 1, "largest round num_items k"),
    "--max-round-mib": (
        "max_round_bytes",
        _MIB,
        "memory one round may need on S1, in MiB (share, hashing table, one client's "
        "evaluation, PSR table; see flwr_fsl.helper.limits)",
    ),
    "--max-clients-per-round": (
        "max_clients_per_round",
        1,
        "clients one round may take (uploads, and PSR queries separately)",
    ),
    "--max-round-gwords": (
        "max_round_work",
        _GWORDS,
        "work one round may cost S1, in 2**30 words evaluated or read over all its clients",
    ),
    "--min-clients": (
        "min_clients",
        1,
        "S1's minimum participation: it returns no share of a round with fewer clients",
    ),
}


def _limit_type(flag: str, unit: int) -> Callable[[str], int]:
    field = (_LIMIT_FLAGS.get(flag) or _QUOTA_FLAGS[flag])[0]
    top = 1 << 62 if field != "max_value_width" else (1 << 20) - 2

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not 1 <= value <= top // unit:
            raise argparse.ArgumentTypeError(f"must be in [1, {top // unit}], got {value}")
        return value * unit

    return parse


def _projections(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= MAX_PROJECTIONS:
        raise argparse.ArgumentTypeError(f"must be in [1, {MAX_PROJECTIONS}], got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
    return value


def _quota(args: argparse.Namespace) -> ServiceLimits:
    """Return S1's resource limits from the flags.

    Raises
    ------
    ConfigurationError
        If they disagree (a reserve above the session limit, ...), naming the flags.
    """
    try:
        return ServiceLimits(**{f: getattr(args, f) for f, _, _ in _QUOTA_FLAGS.values()})
    except ConfigurationError as err:
        text = str(err)
        for flag, (field, _, _) in _QUOTA_FLAGS.items():
            text = text.replace(field, flag)
        raise ConfigurationError(text) from None


def _dp_float(flag: str, *, positive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or (positive and value <= 0):
            raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
        return value

    return parse


def _dp_policy(args: argparse.Namespace) -> DistributedDP | None:
    """Return S1's DP policy from the flags (None without them).

    Raises
    ------
    ConfigurationError
        If only some of the three flags are given, or a value is out of range.
    """
    given = [args.dp_noise_multiplier, args.dp_clip_norm, args.dp_max_weight]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise ConfigurationError(
            "--dp-noise-multiplier, --dp-clip-norm and --dp-max-weight go together"
        )
    return DistributedDP(
        args.dp_noise_multiplier, args.dp_clip_norm, args.dp_max_weight, args.dp_delta
    )


def default_state_dir() -> Path:
    """Return S1's default state directory, ``$FLWR_HOME/fsl/helper-state`` (``~/.flwr``)."""
    home = Path(os.environ.get("FLWR_HOME", "~/.flwr")).expanduser()
    return (home / "fsl" / "helper-state").resolve()


def _dp_budget(args: argparse.Namespace, prefix: str = "dp_budget") -> PrivacyBudget:
    """Return S1's ceiling from ``--dp-budget-epsilon`` / ``--dp-budget-delta``.

    ``prefix="dp_client_budget"`` reads ``--dp-client-budget-epsilon`` / ``-delta`` instead.
    Unset, the ceiling is :data:`~flwr_fsl.families.ssa.dp.DEFAULT_BUDGET` (``ε = 20`` at
    ``δ = 1e-5``, what the strategies announce by default): a deviating S0 that announces a
    larger budget, or starts a fresh run for the same clients, gets no more from S1.

    Raises
    ------
    ConfigurationError
        If the delta is not in (0, 1).
    """
    epsilon, delta = getattr(args, f"{prefix}_epsilon"), getattr(args, f"{prefix}_delta")
    flag = "--" + prefix.replace("_", "-")
    epsilon = DEFAULT_BUDGET.epsilon if epsilon is None else epsilon
    delta = DEFAULT_BUDGET.delta if delta is None else delta
    if not 0 < delta < 1:
        raise ConfigurationError(f"{flag}-delta must be in (0, 1), got {delta:g}")
    return PrivacyBudget(epsilon, delta)


def _enrollment(args: argparse.Namespace) -> Enrollment | None:
    """Return S1's enrollment from ``--enrollment`` / ``--open-enrollment`` (None: neither).

    Raises
    ------
    ConfigurationError
        If both are given, or the file is unreadable or malformed (naming the line).
    """
    if args.enrollment is not None and args.open_enrollment:
        raise ConfigurationError("--enrollment and --open-enrollment exclude each other")
    if args.open_enrollment:
        return Enrollment.open()
    return None if args.enrollment is None else load_enrollment(args.enrollment)


_ENROLLMENT_EPILOG = (
    "client identities: S1 accepts SSA uploads only when signed by a client key on the "
    "--enrollment list. Each client node makes its key and prints its enrollment line with "
    "'flwr-fsl-identity KEYFILE --generate --label NAME' (or 'python -m "
    "flwr_fsl.crypto.identity ...') and gives the key file to its SuperNode as "
    "--node-config 'fsl-signing-key=\"/abs/path/KEYFILE\"'."
)


def read_token(path: Path) -> str:
    """Read an access token file (content stripped; readable by its owner only).

    Raises
    ------
    ConfigurationError
        If the file is empty, not printable text, or readable by group or others.
    OSError
        If it cannot be read.
    """
    if path.stat().st_mode & 0o077:
        raise ConfigurationError(
            f"token file {path} is accessible by group or others: chmod 600 {path}"
        )
    token = path.read_text(encoding="utf-8", errors="replace").strip()
    if not token or not token.isprintable():
        raise ConfigurationError(f"token file {path} is empty or not printable text")
    return token


def _access_token(args: argparse.Namespace, state_dir: Path) -> tuple[str | None, Path | None]:
    """Return S1's access token and its file (None, None with ``--insecure`` and no file).

    Without ``--token-file`` the token is ``<state_dir>/token``, created (random, 0600) when
    missing.

    Raises
    ------
    ConfigurationError
        If the token file is unusable (:func:`read_token`).
    OSError
        If it cannot be read or created.
    """
    if args.token_file is not None:
        return read_token(args.token_file), args.token_file
    if args.insecure:
        return None, None
    path = state_dir / TOKEN_FILE_NAME
    if not path.exists():
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        print(f"{_PROG}: created access token file {path}", flush=True)
    return read_token(path), path


def _print_token(token_file: Path | None) -> None:
    """Print where the access token is and how S0 passes it (or that there is none)."""
    if token_file is not None:
        print(f"{_PROG}: access token file {token_file}", flush=True)
        print(
            f"{_PROG}: S0 passes it with ssa-helper-token-file = <absolute path of a copy of "
            "that file on S0's machine>",
            flush=True,
        )
    else:
        print(
            f"{_PROG}: WARNING: --insecure: no access token, any caller may open sessions",
            flush=True,
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Helper server S1 of flwr_fsl's two-server secure submodel aggregation "
        "and private submodel retrieval (Cui et al. 2023).",
        epilog=_ENROLLMENT_EPILOG,
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9500, help="TCP port, 0 = any free (default 9500)")
    p.add_argument("--key-file", type=Path, required=True, help="S1's X25519 key (PKCS#8 PEM)")
    p.add_argument(
        "--generate-key", action="store_true", help="create the key file if it does not exist"
    )
    p.add_argument(
        "--print-fingerprint", action="store_true", help="print the key's fingerprint and exit"
    )
    p.add_argument(
        "--workers",
        type=_limit_type("--max-open-rounds", 1),
        default=None,
        help="session calls running or queued at once (default: --max-sessions times "
        "--max-calls-per-session); Health and PublicKey have threads of their own",
    )
    p.add_argument(
        "--max-message-mib",
        type=int,
        default=wire.MAX_MESSAGE_BYTES >> 20,
        help=f"gRPC message size limit in MiB (default and maximum {wire.MAX_MESSAGE_BYTES >> 20})",
    )
    quota = p.add_argument_group(
        "resources", "what all sessions together and each one may hold (flwr_fsl.helper.quota)"
    )
    for flag, (field, unit, text) in _QUOTA_FLAGS.items():
        default = getattr(_DEFAULT_QUOTA, field)
        quota.add_argument(
            flag,
            dest=field,
            type=_seconds if unit == 0 else _limit_type(flag, unit),
            default=default,
            metavar="S" if unit == 0 else "N",
            help=f"{text} (default {default:g})"
            if unit == 0
            else f"{text} (default {default // unit})",
        )
    limits = p.add_argument_group(
        "limits", "what one round may cost S1 (checked before it is allocated)"
    )
    for flag, (field, unit, text) in _LIMIT_FLAGS.items():
        default = getattr(_DEFAULT_LIMITS, field)
        limits.add_argument(
            flag,
            dest=field,
            type=_limit_type(flag, unit),
            default=default,
            metavar="N",
            help=f"{text} (default {default // unit})",
        )
    dp = p.add_argument_group(
        "differential privacy",
        "S1 adds Gaussian noise to its share of every round (flwr_fsl.families.ssa.dp); "
        "give --dp-noise-multiplier, --dp-clip-norm and --dp-max-weight together",
    )
    dp.add_argument(
        "--dp-noise-multiplier",
        type=_dp_float("--dp-noise-multiplier", positive=True),
        metavar="Z",
        help="S1's noise std is Z times the round's sensitivity (a floor over what S0 asks)",
    )
    dp.add_argument(
        "--dp-clip-norm",
        type=_dp_float("--dp-clip-norm", positive=True),
        metavar="C",
        help="largest L2 clip norm of a client's update a round may ask for",
    )
    dp.add_argument(
        "--dp-max-weight",
        type=_dp_float("--dp-max-weight", positive=True),
        metavar="W",
        help="largest per-element client weight a round may ask for",
    )
    dp.add_argument(
        "--dp-delta",
        type=_dp_float("--dp-delta", positive=True),
        default=1e-5,
        metavar="DELTA",
        help="delta of the (epsilon, delta) S1 logs (default 1e-5)",
    )
    dp.add_argument(
        "--dp-budget-epsilon",
        type=_dp_float("--dp-budget-epsilon", positive=True),
        metavar="EPS",
        help="S1's ceiling on every run's epsilon: it refuses a round past it, whatever "
        "budget S0 announces (default 20, the strategies' default budget; S1 also enforces "
        "the run's announced budget)",
    )
    dp.add_argument(
        "--dp-client-budget-epsilon",
        type=_dp_float("--dp-client-budget-epsilon", positive=True),
        metavar="EPS",
        help="S1's ceiling on every enrolled client's own epsilon across all runs: it refuses "
        "(per client) one a DP round would take past it (default 20: a fresh run is no "
        "fresh budget)",
    )
    dp.add_argument(
        "--dp-client-budget-delta",
        type=_dp_float("--dp-client-budget-delta", positive=True),
        metavar="DELTA",
        help="delta of --dp-client-budget-epsilon (default 1e-5)",
    )
    dp.add_argument(
        "--dp-budget-delta",
        type=_dp_float("--dp-budget-delta", positive=True),
        metavar="DELTA",
        help="delta of --dp-budget-epsilon (default 1e-5)",
    )
    p.add_argument(
        "--min-value-check",
        choices=("off", "projected", "exact"),
        default="projected",
        help="refuse SSA rounds whose value-word check is weaker (off < projected < exact; "
        "default projected: a malicious client cannot move an element's sum unchecked)",
    )
    p.add_argument(
        "--min-projections",
        type=_projections,
        default=DEFAULT_PROJECTIONS,
        metavar="N",
        help=f"refuse projected SSA rounds with fewer than N random projections (in [1, "
        f"{MAX_PROJECTIONS}]; each halves the chance that a word past 2T gets through; default "
        f"{DEFAULT_PROJECTIONS})",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where S1 keeps each run's privacy account, so restarts and new sessions resume "
        "it (default $FLWR_HOME/fsl/helper-state, FLWR_HOME defaulting to ~/.flwr)",
    )
    p.add_argument(
        "--enrollment",
        type=Path,
        metavar="FILE",
        help="enrollment list of client Ed25519 public keys, one '<hex key> [label]' per line "
        "(required unless --open-enrollment)",
    )
    p.add_argument(
        "--open-enrollment",
        action="store_true",
        help="INSECURE: accept any client signing key (a deviating S0 can then invent clients)",
    )
    p.add_argument("--tls-cert", type=Path, help="serve TLS with this PEM certificate chain")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument(
        "--token-file",
        type=Path,
        help="the access token every call but Health/PublicKey must carry (file content, "
        "stripped; mode 0600); default <state-dir>/token, created on first start; S0 sets "
        "ssa-helper-token-file to a copy of it",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve without an access token (unless --token-file is given: then allow it over "
        "plain gRPC on a non-loopback --host); anyone who reaches the port can open sessions",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def _announce_dp(service: HelperService) -> None:
    """Print S1's DP policy and ceilings (one line each, only those that are set)."""
    policy = service.limits.dp
    if policy is not None:
        print(
            f"{_PROG}: DP noise on every round: noise multiplier >= {policy.noise_multiplier:g}, "
            f"clip norm <= {policy.clip_norm:g}, max weight <= {policy.max_weight:g}",
            flush=True,
        )
    for what, ceiling in (
        ("per run", service.limits.dp_budget),
        ("per enrolled client, across runs", service.limits.dp_client_budget),
    ):
        if ceiling is not None:
            print(
                f"{_PROG}: DP budget ceiling {what}: epsilon <= {ceiling.epsilon:g} at delta "
                f"{ceiling.delta:g}",
                flush=True,
            )


def _before_serving(service: HelperService) -> None:
    """Print S1's enrollment and state folder; keep its peak memory flat in the clients.

    :func:`~flwr_fsl.helper.memory.bound_allocator` fixes glibc's mmap threshold and arena
    count in this (serving) process only, unless the operator's ``MALLOC_*`` variables do.
    """
    bound_allocator()
    print(f"{_PROG}: client enrollment: {service.enrollment.describe()}", flush=True)
    print(f"{_PROG}: privacy accounts in {service.accounts.state_dir}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:  # noqa: C901
    """Run the helper server until SIGINT/SIGTERM.

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments (``sys.argv[1:]`` by default).

    Returns
    -------
    int
        Exit code: 0 after a clean stop, 1 if the address cannot be bound, 2 for bad
        arguments or key file.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not 1 <= args.max_message_mib <= wire.MAX_MESSAGE_BYTES >> 20:
        parser.error(f"--max-message-mib must be in [1, {wire.MAX_MESSAGE_BYTES >> 20}]")
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    try:
        enrollment = _enrollment(args)
        if enrollment is None and not args.print_fingerprint:
            raise ConfigurationError(
                "--enrollment FILE is required (the client keys S1 accepts); pass "
                "--open-enrollment to accept any signer (insecure)"
            )
        keypair, created = load_or_create_key(args.key_file, generate=args.generate_key)
        service = HelperService(
            keypair,
            quota=_quota(args),
            limits=HelperLimits(
                **{field: getattr(args, field) for field, _, _ in _LIMIT_FLAGS.values()},
                dp=_dp_policy(args),
                dp_budget=_dp_budget(args),
                dp_client_budget=_dp_budget(args, "dp_client_budget"),
                min_value_check=args.min_value_check,
                min_projections=args.min_projections,
            ),
            state_dir=args.state_dir if args.state_dir is not None else default_state_dir(),
            enrollment=enrollment,
        )
        tls = (args.tls_key.read_bytes(), args.tls_cert.read_bytes()) if args.tls_cert else None
        if tls is None and not args.insecure and not is_loopback(args.host):
            raise ConfigurationError(
                f"--host {args.host} is not loopback: the access token and session secrets "
                "would travel in clear; serve TLS (--tls-cert, --tls-key) or pass --insecure"
            )
        if args.token_file is not None:
            read_token(args.token_file)  # fail before anything starts
    except (SealedBoxError, ValueError, OSError) as err:
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return 2
    if created:
        print(f"{_PROG}: created key file {args.key_file}", flush=True)
    print(f"{_PROG}: public key fingerprint {keypair.fingerprint}", flush=True)
    _announce_dp(service)
    if args.print_fingerprint:
        return 0
    _before_serving(service)
    try:
        token, token_file = _access_token(args, service.accounts.state_dir or default_state_dir())
    except (ValueError, OSError) as err:
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return 2
    _print_token(token_file)
    try:
        server, port = start_server(
            service,
            args.host,
            args.port,
            max_workers=args.workers,
            max_message_bytes=args.max_message_mib << 20,
            tls=tls,
            token=token,
            insecure=args.insecure,
        )
    except (OSError, ValueError) as err:
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, OSError) else 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"{_PROG}: listening on {format_address(args.host, port)}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop(grace=2.0).wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(f"{_PROG}: stopped", flush=True)
    return 0
