"""The chaos soak's report: docs/reliability.md and its lateness plot (issue 14).

The soak's orchestrator hands over one JSON dict per leg (the fleet it ran, the load it sent, the
faults it injected, and the checker's checks, lateness and figures). This module only reads those
dicts and writes them down: every number in the report comes from a leg, and a figure a leg does
not carry is shown as "-" rather than guessed. A leg fails when a check found a violation, when a
check looked at nothing, or when no check ran at all (the checker's checks judge lateness);
the failing reasons and the checker's evidence are written next to the verdict.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

#: Shown where a leg does not carry a figure (never a made-up zero).
MISSING = "-"
#: Load figures that are lists of ids: the report gives their length, not the ids.
_ID_LISTS = ("order_ids",)
#: How each fault kind the orchestrator injects is drawn (colour, line style): strong colours and
#: a style of its own, so a fault line is never taken for a timer kind's dots.
_FAULT_STYLES = {
    "sigkill_worker": ("#b2182b", "solid"),
    "restart_api": ("#2166ac", "dashdot"),
    "flushall_redis": ("#762a83", (0, (5, 2))),
    "restart_redis": ("#762a83", "solid"),
    "purge_rabbitmq": ("#8c510a", (0, (5, 2))),
    "terminate_db_connections": ("#e08214", "dotted"),
    "restart_postgres": ("#e08214", "solid"),
    "sigstop_worker": ("#01665e", (0, (3, 1, 1, 1, 1, 1))),
}
#: Other fault kinds take these in turn.
_SPARE_STYLES = (
    ("#4d4d4d", "solid"),
    ("#c51b7d", "dashdot"),
    ("#4d9221", (0, (5, 2))),
    ("#35978f", "dotted"),
)
#: Timer kinds' dots, in sorted order of kind (the same colour on every leg).
_KIND_COLOURS = (
    "#1f77b4",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#d62728",
)


#: How the checker judges what the issue leaves open (fixed text: the same for every run).
HOW_JUDGED = [
    "## How the promises are judged",
    "",
    "- **On time.** A deadline timer (pay reminder, unpaid and unshipped cancels, automatic "
    "receipt, default reviews) and the order event it causes must act no earlier than its "
    "deadline (less 0.2 s for the clock sync between processes) and no later than the late "
    "limit: scan interval + lease + scan grace + 3 s for commits and a scanner batch on a loaded "
    "two-core machine (load average about 7; a run with 2 s saw one reminder 8 ms past it). "
    "A worker killed or frozen holding a claim keeps it for one lease; the scanner of another "
    "worker then takes it within a scan interval (of timers due at least the grace ago). "
    "Notices, trade closes and refund checks are measured and plotted, not judged: they have no "
    "business deadline. One documented hold: an unpaid cancel whose payment's state is not known "
    "(a start never answered because the API process was killed mid-call, a code the provider "
    "does not show yet) waits until the attempt's expiry plus 2 minutes, as the providers' 'no "
    "such trade' proves nothing before then (never cancel on a guess); it must come by that "
    "moment plus a retry's step (30 s) plus the late limit. A timer that found its order "
    "already moved on (a cancel of an order paid meanwhile) acted on nothing and is not judged.",
    "- **The fast clock.** One worker runs its whole life with its wall clock 30 s ahead "
    "(libfaketime). Every dueflow process on a server database takes its time from the "
    "database's clock, so that worker must act neither early nor late.",
    "- **Deliveries are counted where they arrive.** A notice or reminder whose delivery id "
    "reaches the receiving webhook twice is a violation unless dueflow's reminders row counted "
    "that many possible deliveries (a send whose answer was lost, or a worker killed mid-send: "
    "the documented at-least-once case receivers drop by `X-Dueflow-Delivery`); two delivery ids "
    "for one order and event always are.",
    "- **Money.** The simulator is the provider's truth: every trade it took is the order's "
    "payment or a recorded discrepancy with a refund, no trade is refunded twice or beyond its "
    "amount, and every refund an operator approved ended succeeded or failed.",
    "- **The overload leg** is judged by the overload's bounds: a must-happen deadline (a "
    "cancel, a receipt, a review, and the timeout events they cause) may be 15 s later than the "
    "quiet limit, a pay reminder (a message: a worker that is behind takes the must-happen "
    "timers first) 60 s later, and the backlog (timers due more than the scan's grace ago and "
    "not done, read every second) must be gone within 60 s of the last order placed. Every "
    "other promise is the quiet legs'.",
    "- **A check that looked at nothing fails**: a promise never exercised is no promise kept.",
    "",
]


def write_report(legs: list[dict[str, Any]], markdown: Path, plot: Path, *, command: str) -> None:
    """docs/reliability.md and its PNG (one subplot per leg).

    The markdown embeds the plot as ``img/<plot name>``, so the plot must sit in the ``img``
    folder beside the markdown; anything else would write a report with a broken image.
    """
    if plot.parent.resolve() != (markdown.parent / "img").resolve():
        raise ValueError(f"the plot must be in {markdown.parent / 'img'}, not {plot.parent}")
    plot.parent.mkdir(parents=True, exist_ok=True)
    render_plot(legs, plot)
    markdown.write_text(render_markdown(legs, plot_name=plot.name, command=command))


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``values`` by nearest rank, and their count ``n``.

    Nearest rank: the p-th percentile is the smallest value with at least p% of the values at or
    below it, so it is always one of the values measured. An empty list has only ``n`` (0).
    """
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    count = len(ordered)

    def rank(p: int) -> float:
        return ordered[max(1, math.ceil(p * count / 100)) - 1]

    return {"p50": rank(50), "p99": rank(99), "max": ordered[-1], "n": count}


def failures(leg: Mapping[str, Any]) -> list[str]:
    """Why ``leg`` fails, one plain sentence per reason; empty when it passes."""
    checks = leg.get("checks") or []
    reasons = [] if checks else ["no check ran"]
    for check in checks:
        name = check.get("name", "?")
        if check.get("violations", 0):
            reasons.append(f"check {name}: {check['violations']} violation(s)")
        if not check.get("checked", 0):
            reasons.append(f"check {name} looked at nothing (checked 0)")
    # Lateness itself is judged by the checker's checks (deadline kinds only, with their
    # documented holds): the raw list also holds notices and trade closes, which have no limit.
    return reasons


def render_markdown(legs: list[dict[str, Any]], *, plot_name: str, command: str) -> str:
    """The whole docs/reliability.md: summary first, then one section per leg."""
    if not legs:
        raise ValueError("no leg to report")
    failed = [leg for leg in legs if failures(leg)]
    out = ["# Reliability: the chaos soak", ""]
    out += [
        "The chaos soak runs the real dueflow as a fleet on this machine: several API processes "
        "and workers on one database and one trigger (each leg's fleet is listed below), "
        "under a load of buyers, sellers and an operator placing, paying (late, twice, with duplicate "
        "notifications, as the order closes), cancelling, shipping, receiving and refunding, "
        "while faults are injected: processes killed, frozen and restarted, the trigger's store "
        "wiped, database connections cut. When the load stops, a checker reads dueflow's "
        "database, the payment simulator and the webhook receiver and tests every promise "
        "below; any violation fails the run, with its evidence.",
        "",
        "Run it with:",
        "",
        "```sh",
        command,
        "```",
        "",
        f"Run of {_run_date(legs)}. Verdict: "
        + (
            "**PASS** (every leg)."
            if not failed
            else f"**FAIL** ({len(failed)} of {len(legs)} legs: "
            + ", ".join(_leg_name(leg) for leg in failed)
            + ")."
        ),
        "",
        "## Summary",
        "",
    ]
    out += _table(
        [
            "leg",
            "orders",
            "payments paid",
            "faults injected",
            "lateness p50 (s)",
            "p99 (s)",
            "max (s)",
            "late limit (s)",
            "violations",
            "verdict",
        ],
        [_summary_row(leg) for leg in legs],
    )
    out += [
        "",
        "Orders and payments paid are counted in dueflow's database at the end of the leg "
        "(the load generator's own count where the database figure is missing). Lateness is "
        "when a timer acted minus its deadline, over every timer done.",
        "",
        _fault_totals(legs),
        "",
        *_pace_section(legs),
        *HOW_JUDGED,
        "## Lateness over the run",
        "",
        "Each dot is a timer done (x: when it acted, in seconds since the leg started; y: how "
        "late it acted). The dashed line is the late limit; each vertical line is a fault.",
        "",
        f"![lateness](img/{plot_name})",
        "",
    ]
    for leg in legs:
        out += _leg_section(leg)
    return "\n".join(out).rstrip("\n") + "\n"


def render_plot(legs: list[dict[str, Any]], path: Path) -> None:
    """A PNG at ``path``: per leg, lateness against time since the start, faults marked."""
    if not legs:
        raise ValueError("no leg to plot")
    kinds = sorted({row.get("kind", "?") for leg in legs for row in leg.get("lateness", [])})
    kind_colour = {kind: _KIND_COLOURS[i % len(_KIND_COLOURS)] for i, kind in enumerate(kinds)}
    fault_style = _fault_styles(fault.get("kind", "?") for leg in legs for fault in _faults(leg))

    figure = Figure(figsize=(11, 3.2 * len(legs)), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    for axes, leg in zip(figure.subplots(len(legs), 1, squeeze=False)[:, 0], legs, strict=True):
        _plot_leg(axes, leg, kind_colour, fault_style)
    figure.savefig(path, format="png", dpi=110)


def _plot_leg(
    axes: Axes,
    leg: Mapping[str, Any],
    kind_colour: Mapping[str, str],
    fault_style: Mapping[str, tuple[str, Any]],
) -> None:
    """One leg's subplot: a dot per timer done, the late limit, a vertical line per fault."""
    start = _started(leg)
    points: dict[str, tuple[list[float], list[float]]] = {}
    for row in leg.get("lateness", []):
        if start is None or "acted" not in row or "late_s" not in row:
            continue
        xs, ys = points.setdefault(row.get("kind", "?"), ([], []))
        xs.append((_parse(row["acted"]) - start).total_seconds())
        ys.append(float(row["late_s"]))
    # the legend in two groups under plain headers: the timers (with the limit), then the faults
    header = Line2D([], [], linestyle="none")
    handles: list[Any] = [header]
    labels = ["timers done"]
    for kind in sorted(points):
        xs, ys = points[kind]
        handles.append(axes.scatter(xs, ys, s=7, alpha=0.45, color=kind_colour[kind], linewidths=0))
        labels.append(f"{kind} ({len(xs)})")
    limit = leg.get("bounds", {}).get("late_limit")
    if limit is not None:
        handles.append(axes.axhline(limit, color="black", linestyle="--", linewidth=1))
        labels.append(f"late limit {_num(limit)} s")
    faults: list[tuple[str, float]] = []
    if start is not None:
        faults = [
            (fault.get("kind", "?"), (_parse(fault["at"]) - start).total_seconds())
            for fault in _faults(leg)
            if "at" in fault
        ]
    for kind, at in faults:
        colour, style = fault_style[kind]
        axes.axvline(at, color=colour, linestyle=style, linewidth=1.2, alpha=0.8)
    counts = Counter(kind for kind, _ in faults)
    handles.append(header)
    labels.append("faults injected" if counts else "no fault injected")
    for kind in sorted(counts):
        colour, style = fault_style[kind]
        handles.append(Line2D([], [], color=colour, linestyle=style, linewidth=1.5))
        labels.append(f"{kind} ({counts[kind]})")

    seconds = leg.get("seconds")
    if seconds:
        axes.set_xlim(0, float(seconds))
    late = [value for _, ys in points.values() for value in ys]
    top = max([*late, limit or 0.0, 1.0])
    axes.set_ylim(min([*late, 0.0]) - 0.04 * top, top * 1.12)
    if not points:
        axes.text(0.5, 0.5, "no timer done", transform=axes.transAxes, ha="center", va="center")
    verdict = "FAIL" if failures(leg) else "PASS"
    axes.set_title(f"{leg.get('title') or _leg_name(leg)}: {verdict}", fontsize=10, loc="left")
    axes.set_xlabel("seconds since the leg started", fontsize=8)
    axes.set_ylabel("lateness (s)", fontsize=8)
    axes.tick_params(labelsize=8)
    axes.grid(True, linewidth=0.4, alpha=0.5)
    legend = axes.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        frameon=False,
        markerscale=2,
        handlelength=2.5,
    )
    for text, handle in zip(legend.get_texts(), handles, strict=True):
        if handle is header:
            text.set_fontweight("bold")


def _leg_section(leg: Mapping[str, Any]) -> list[str]:
    """One leg: fleet, settings, faults, load, figures, checks, evidence and lateness."""
    reasons = failures(leg)
    out = [f"## Leg {_leg_name(leg)}: {leg.get('title', MISSING)}", ""]
    out.append(
        f"From {_clock(leg.get('started'))} to {_clock(leg.get('ended'))} "
        f"({_num(leg.get('seconds'))} s). Verdict: **{'FAIL' if reasons else 'PASS'}**."
    )
    out += ["", *[f"- {reason}" for reason in reasons], ""] if reasons else [""]

    out += ["### Fleet and settings", ""]
    fleet = leg.get("fleet", {})
    settings = leg.get("settings", {})
    bounds = leg.get("bounds", {})
    rows = [[f"fleet: {key}", _cell(value)] for key, value in fleet.items()]
    rows += [[f"`{key}`", _cell(value)] for key, value in sorted(settings.items())]
    rows += [[f"bound: {key}", _cell(value)] for key, value in bounds.items()]
    out += _table(["what", "value"], rows) if rows else ["No fleet or settings recorded."]
    out.append("")

    out += ["### Faults injected", ""]
    faults = _faults(leg)
    if faults:
        start = _started(leg)
        by_kind: dict[str, list[str]] = {}
        for fault in faults:
            by_kind.setdefault(fault.get("kind", "?"), []).append(fault.get("at", ""))
        rows = []
        for kind in sorted(by_kind):
            times = sorted((at for at in by_kind[kind] if at), key=_parse)
            first, last = (times[0], times[-1]) if times else (None, None)
            rows.append([kind, str(len(by_kind[kind])), _since(first, start), _since(last, start)])
        out += _table(["kind", "count", "first", "last"], rows)
        out += ["", f"{len(faults)} faults in all."]
    else:
        out.append("No fault was injected.")
    out.append("")

    out += ["### Load", ""]
    load = leg.get("load", {})
    rows = []
    for key, value in load.items():
        if key in _ID_LISTS and isinstance(value, list):
            rows.append([key, f"{len(value)} ids"])
        else:
            rows.append([key, _cell(value)])
    out += _table(["figure", "value"], rows) if rows else ["No load figures recorded."]
    out.append("")

    figures = {key: value for key, value in leg.get("figures", {}).items() if key != "lateness"}
    if figures:
        out += ["### What dueflow and the simulator hold at the end", ""]
        orders = figures.pop("orders", None)
        if isinstance(orders, Mapping) and orders:
            statuses = sorted({status for counts in orders.values() for status in counts})
            out += _table(
                ["flow", *statuses, "all"],
                [
                    [
                        flow,
                        *[_cell(counts.get(status, MISSING)) for status in statuses],
                        str(sum(counts.values())),
                    ]
                    for flow, counts in orders.items()
                ],
            )
            out.append("")
        if figures:
            out += _table(
                ["figure", "value"], [[key, _cell(value)] for key, value in figures.items()]
            )
            out.append("")

    out += ["### Checks", ""]
    checks = leg.get("checks") or []
    if checks:
        out += _table(
            ["check", "promise", "checked", "violations", "result"],
            [
                [
                    check.get("name", "?"),
                    check.get("promise", MISSING),
                    _cell(check.get("checked", MISSING)),
                    _cell(check.get("violations", MISSING)),
                    _check_result(check),
                ]
                for check in checks
            ],
        )
    else:
        out.append("No check ran.")
    out.append("")
    for check in checks:
        if check.get("violations", 0):
            evidence = [str(line) for line in check.get("evidence", [])]
            out += [f"Evidence of {check.get('name', '?')}:", ""]
            out += _code_block(evidence or ["(the checker gave no evidence)"])
            out.append("")

    out += ["### Lateness by timer kind", ""]
    lateness = _lateness_by_kind(leg)
    if lateness:
        out += _table(
            ["timer kind", "p50 (s)", "p99 (s)", "max (s)", "n"],
            [
                [kind, *[_num(stats.get(key)) for key in ("p50", "p99", "max", "n")]]
                for kind, stats in lateness.items()
            ],
        )
    else:
        out.append("No timer was done.")
    out.append("")
    return out


def _summary_row(leg: Mapping[str, Any]) -> list[str]:
    """The leg's line of the summary table."""
    figures = leg.get("figures", {})
    load = leg.get("load", {})
    orders = figures.get("orders")
    if isinstance(orders, Mapping) and orders:
        order_count: Any = sum(sum(counts.values()) for counts in orders.values())
    elif isinstance(load.get("orders"), Mapping):
        order_count = sum(load["orders"].values())
    else:
        order_count = None
    paid = figures.get("payments", {}).get("paid", load.get("paid"))
    overall = _lateness_by_kind(leg).get("all", {})
    checks = leg.get("checks") or []
    return [
        _leg_name(leg),
        _num(order_count),
        _num(paid),
        str(len(_faults(leg))),
        _num(overall.get("p50")),
        _num(overall.get("p99")),
        _num(overall.get("max")),
        _num(leg.get("bounds", {}).get("late_limit")),
        str(sum(check.get("violations", 0) for check in checks)),
        "FAIL" if failures(leg) else "PASS",
    ]


def _pace_section(legs: list[dict[str, Any]]) -> list[str]:
    """What the machine measured before the legs, and the pace each leg ran at (nothing for
    legs that carry no pace)."""
    paced = [leg for leg in legs if leg.get("pace")]
    if not paced:
        return []
    machine = paced[0]["pace"].get("machine", {})
    out = ["## The machine, and the pace of each leg", ""]
    out.append(
        "Before the legs the soak measures what this machine can do: the place rate of each "
        "database (`benchmarks/http_place.py`, as many API processes as the legs run) and the "
        "herd rate of each leg's database and trigger (`benchmarks/herd.py`). A leg then runs "
        "at a share of what the machine carries of the soak's load: share x min(place rate / "
        "places a person costs, herd rate / timers a person arms) people a second, so a slow "
        "machine and a fast one are loaded alike."
    )
    out.append("")
    rows = [
        [
            f"place rate, {run.get('database', MISSING)}, {run.get('processes', MISSING)} API",
            f"{_num(run.get('orders_per_s'))}/s, {_num(run.get('server_cpu_ms_per_order'))} ms "
            f"CPU an order, p99 {_num(run.get('p99_ms'))} ms",
        ]
        for run in machine.get("place", {}).values()
    ]
    rows += [
        [
            f"herd rate, {name} ({run.get('trigger', MISSING)}, {run.get('workers', MISSING)} "
            "workers)",
            f"{_num(run.get('cancels_per_s'))} cancels/s ({_num(run.get('orders'))} orders), "
            f"p99 {_num(run.get('lateness_p99_s'))} s",
        ]
        for name, run in machine.get("herd", {}).items()
    ]
    rows.append(["calibration took", f"{_num(machine.get('seconds'))} s"])
    out += _table(["measured", "value"], rows)
    out.append("")
    out += _table(
        [
            "leg",
            "share",
            "people/s asked",
            "orders placed/s",
            "bound by",
            "places a person costs (assumed)",
            "places a person cost (measured)",
        ],
        [
            [
                _leg_name(leg),
                f"{leg['pace'].get('share', 0):.0%}",
                _num(leg["pace"].get("rate")),
                _num(leg.get("load", {}).get("placed_per_s")),
                _cell(leg["pace"].get("bound_by")),
                _num(leg["pace"].get("person_cost")),
                _num(leg.get("cpu", {}).get("places_per_person")),
            ]
            for leg in paced
        ],
    )
    out += [
        "",
        "Measured cost: the fleet's CPU over the load a person, in the place benchmark's CPU an "
        "order; only in a leg where no process was restarted (the overload leg).",
        "",
    ]
    return out


def _fault_totals(legs: list[dict[str, Any]]) -> str:
    """One sentence: how many faults of each kind were injected over every leg."""
    counts = Counter(fault.get("kind", "?") for leg in legs for fault in _faults(leg))
    if not counts:
        return "No fault was injected in any leg."
    kinds = ", ".join(f"{kind} {counts[kind]}" for kind in sorted(counts))
    return f"Faults injected over all legs: {kinds} ({counts.total()} in all)."


def _lateness_by_kind(leg: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The checker's lateness figures per timer kind, ``all`` last; else worked out from the list."""
    given = leg.get("figures", {}).get("lateness")
    if given:
        return {kind: given[kind] for kind in sorted(given, key=lambda k: (k == "all", k))}
    rows = leg.get("lateness", [])
    by_kind: dict[str, list[float]] = {}
    for row in rows:
        if "late_s" in row:
            by_kind.setdefault(row.get("kind", "?"), []).append(float(row["late_s"]))
    if not by_kind:
        return {}
    result: dict[str, Mapping[str, Any]] = {
        kind: percentiles(by_kind[kind]) for kind in sorted(by_kind)
    }
    result["all"] = percentiles([value for values in by_kind.values() for value in values])
    return result


def _check_result(check: Mapping[str, Any]) -> str:
    """ok, VIOLATED, or a word that the check looked at nothing."""
    if check.get("violations", 0):
        return "VIOLATED"
    if not check.get("checked", 0):
        return "checked nothing"
    return "ok"


def _fault_styles(kinds: Iterable[str]) -> dict[str, tuple[str, Any]]:
    """A (colour, line style) per fault kind: the fixed one if known, else the next spare one."""
    styles: dict[str, tuple[str, Any]] = {}
    spare = 0
    for kind in sorted(set(kinds)):
        if kind in _FAULT_STYLES:
            styles[kind] = _FAULT_STYLES[kind]
        else:
            styles[kind] = _SPARE_STYLES[spare % len(_SPARE_STYLES)]
            spare += 1
    return styles


def _faults(leg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The leg's faults (none if it has no list)."""
    return list(leg.get("faults") or [])


def _leg_name(leg: Mapping[str, Any]) -> str:
    """The leg's short name."""
    return str(leg.get("name", "?"))


def _parse(value: str) -> datetime:
    """An ISO time; a time without a zone is taken as UTC."""
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _started(leg: Mapping[str, Any]) -> datetime | None:
    """When the leg started, if it says."""
    started = leg.get("started")
    return _parse(started) if started else None


def _run_date(legs: list[dict[str, Any]]) -> str:
    """When the first leg started, in UTC, or "an unrecorded date"."""
    starts = [start for leg in legs if (start := _started(leg)) is not None]
    if not starts:
        return "an unrecorded date"
    return min(starts).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _clock(value: str | None) -> str:
    """An ISO time as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if not value:
        return MISSING
    return _parse(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _since(value: str | None, start: datetime | None) -> str:
    """A time as seconds since the leg started, with its clock time."""
    if not value:
        return MISSING
    clock = _parse(value).astimezone(UTC).strftime("%H:%M:%S")
    if start is None:
        return clock
    return f"+{_num((_parse(value) - start).total_seconds())} s ({clock})"


def _num(value: Any) -> str:
    """A number as the report writes it: integers as they are, other numbers to 3 decimals."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.3f}"


def _cell(value: Any) -> str:
    """A value for a table cell: mappings as ``key n, key n``, nested ones in brackets."""
    if isinstance(value, Mapping):
        if not value:
            return "none"
        return ", ".join(
            f"{key} ({_cell(inner)})" if isinstance(inner, Mapping) else f"{key} {_cell(inner)}"
            for key, inner in value.items()
        )
    if isinstance(value, list | tuple):
        return ", ".join(_cell(item) for item in value) or "none"
    return _num(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table; pipes inside cells are escaped so they do not split a cell."""

    def line(cells: list[str]) -> str:
        return (
            "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"
        )

    return [line(header), "|" + "|".join("---" for _ in header) + "|", *[line(r) for r in rows]]


def _code_block(lines: list[str]) -> list[str]:
    """Lines in a fenced block whose fence is longer than any run of backticks in them."""
    longest = 0
    for line in lines:
        run = 0
        for char in line:
            run = run + 1 if char == "`" else 0
            longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *lines, fence]
