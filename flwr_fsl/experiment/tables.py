"""The harness's printed comparison: per-round table, summary table, what each party learns."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from flwr_fsl.experiment.records import ExperimentRecord, Metric, RoundRecord, _mean

__all__ = ["learns_text", "round_table", "summary_table"]


MAX_WIDTH = 120
"""Widest line the tables print (examples, notebooks and benchmarks print them)."""
MAX_LABEL = 16
"""Widest arm label in a table (longer ones are cut with an ellipsis; the key stays whole)."""


# -- tables -----------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _bytes(value: float | None) -> str:
    """Return ``value`` bytes in the unit that keeps it short (``1.23 MB``)."""
    if value is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _label(text: str, width: int = MAX_LABEL) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _label_width(record: ExperimentRecord) -> int:
    return min(MAX_LABEL, max(len("arm"), *(len(a.label) for a in record.arms)))


def round_table(record: ExperimentRecord, metrics: Sequence[Metric] = ()) -> str:
    """Return the per-round table: one row per round and arm.

    Columns: the metrics, training-phase bytes per client down and up, clients sampled,
    replies dropped ("drops"), wall and server seconds, and a note for rounds that failed or changed
    nothing. To stay within :data:`MAX_WIDTH`, labels are cut first, then the server seconds
    are left out. Round 0 (the initial model) is shown when a server metric reported it.

    Parameters
    ----------
    record : ExperimentRecord
        The experiment.
    metrics : Sequence[Metric]
        The metric columns.

    Returns
    -------
    str
        The table (no trailing newline).
    """
    mwidths = [max(7, len(m.title)) for m in metrics]
    # Labels give way first, then the server-seconds column.
    fixed = 7 + sum(w + 2 for w in mwidths) + 2 * 11 + 9 + 7 + 9 + len("  no aggregate")
    server = MAX_WIDTH - fixed - 8 >= 8
    width = max(8, min(_label_width(record), MAX_WIDTH - fixed - (8 if server else 0)))
    header = f"{'round':>5}  {'arm':<{width}}" + "".join(
        f"  {m.title:>{w}}" for m, w in zip(metrics, mwidths, strict=True)
    )
    header += (
        f"  {'down/cl':>9}  {'up/cl':>9}  {'clients':>7}  {'drops':>5}"
        f"  {'round s':>7}" + (f"  {'srv s':>6}" if server else "") + "  note"
    )
    lines = [header, "-" * len(header)]
    server_metrics = [m for m in metrics if m.source == "server"]
    for arm in record.arms:
        if arm.initial_metrics and server_metrics:
            initial = RoundRecord(0, server_metrics=arm.initial_metrics)
            row = f"{0:>5}  {_label(arm.label, width):<{width}}" + "".join(
                f"  {_fmt(m.value(initial), f'.{m.digits}f'):>{w}}"
                for m, w in zip(metrics, mwidths, strict=True)
            )
            lines.append(row.rstrip())
    rounds = sorted({r.server_round for a in record.arms for r in a.rounds})
    by_arm = [{r.server_round: r for r in a.rounds} for a in record.arms]
    for rnd in rounds:
        for arm, stats in zip(record.arms, by_arm, strict=True):
            r = stats.get(rnd)
            if r is None:
                continue
            note = "failed" if r.failed else ("" if r.aggregated else "no aggregate")
            row = f"{rnd:>5}  {_label(arm.label, width):<{width}}" + "".join(
                f"  {_fmt(m.value(r), f'.{m.digits}f'):>{w}}"
                for m, w in zip(metrics, mwidths, strict=True)
            )
            row += (
                f"  {_bytes(r.down_bytes):>9}  {_bytes(r.up_bytes):>9}"
                f"  {_fmt(r.clients, 'd'):>7}  {len(r.dropped):>5}  {_fmt(r.seconds, '.1f'):>7}"
            )
            row += f"  {_fmt(r.server_seconds, '.1f'):>6}" if server else ""
            row += f"  {note}"
            lines.append(row.rstrip())
    return "\n".join(lines)


def summary_table(record: ExperimentRecord, metrics: Sequence[Metric] = ()) -> str:
    """Return the summary: one row per arm.

    Columns: the headline metric (the first of ``metrics``) after the last round and its
    difference to the baseline arm, mean bytes per client per round down and up (training
    phases) and the upload relative to the baseline, evaluation download per client, rounds
    aggregated, and mean server / grid seconds per round and total seconds. Lines fit
    :data:`MAX_WIDTH` for labels up to :data:`MAX_LABEL` and a few metrics.

    Parameters
    ----------
    record : ExperimentRecord
        The experiment (its ``baseline`` names the reference arm).
    metrics : Sequence[Metric]
        The first is the headline; none gives no metric columns.

    Returns
    -------
    str
        The table (no trailing newline).
    """
    headline = metrics[0] if metrics else None
    base = record.arm(record.baseline) if record.baseline is not None else None
    relative = base is not None and len(record.arms) > 1
    width = _label_width(record)
    header = f"{'arm':<{width}}"
    if headline is not None:
        final_title = f"final {headline.title}"
        header += f"  {final_title:>{max(10, len(final_title))}}"
        if relative:
            header += f"  {'d ' + headline.title:>{max(8, len(headline.title) + 2)}}"
    header += f"  {'down/cl':>9}  {'up/cl':>9}"
    share_title = f"up vs {_label(base.key, 10)}" if base is not None else ""
    if relative:
        header += f"  {share_title:>{max(8, len(share_title))}}"
    # The grid-seconds column goes first when a long baseline name would widen the table.
    grid = len(header) + 45 <= MAX_WIDTH
    header += f"  {'eval down':>9}  {'rounds':>6}  {'srv s':>7}"
    header += f"  {'grid s':>6}  {'total s':>7}" if grid else f"  {'total s':>7}"
    lines = [header, "-" * len(header)]
    for arm in record.arms:
        row = f"{_label(arm.label):<{width}}"
        if headline is not None:
            final = arm.final(headline)
            row += f"  {_fmt(final, f'.{headline.digits}f'):>{max(10, len(final_title))}}"
            if relative and base is not None:
                base_final = base.final(headline)
                diff = None if final is None or base_final is None else final - base_final
                row += f"  {_fmt(diff, f'+.{headline.digits}f'):>{max(8, len(headline.title) + 2)}}"
        up, down = arm.mean("up_bytes"), arm.mean("down_bytes")
        row += f"  {_bytes(down):>9}  {_bytes(up):>9}"
        if relative and base is not None:
            base_up = base.mean("up_bytes")
            share = "n/a" if up is None or not base_up else f"{up / base_up * 100:.1f}%"
            row += f"  {share:>{max(8, len(share_title))}}"
        server = _mean(s for r in arm.rounds if (s := r.server_seconds) is not None)
        done = f"{len(arm.aggregated_rounds)}/{len(arm.rounds)}"
        row += f"  {_bytes(arm.mean('eval_down_bytes')):>9}  {done:>6}  {_fmt(server, '.2f'):>7}"
        if grid:
            row += f"  {_fmt(arm.mean('grid_seconds'), '.2f'):>6}"
        row += f"  {arm.seconds:>7.1f}"
        lines.append(row)
    return "\n".join(lines)


def learns_text(record: ExperimentRecord) -> str:
    """Return "what each party learns", one block per arm (as the arms define it)."""
    width = _label_width(record)
    lines = ["what each party learns:"]
    for arm in record.arms:
        items = list(arm.learns.items()) or [("", "(not stated)")]
        for i, (party, what) in enumerate(items):
            name = _label(arm.label) if i == 0 else ""
            lines += textwrap.wrap(
                f"{party + ': ' if party else ''}{what}",
                MAX_WIDTH,
                initial_indent=f"  {name:<{width}}  ",
                subsequent_indent=" " * (width + 6),
            )
    return "\n".join(lines)
