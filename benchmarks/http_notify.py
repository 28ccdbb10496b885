"""Payment notifications over real HTTP, driven by wrk, against ``dueflow serve``; beside placing.

``benchmarks/payments.py --direct`` posts the simulator's notifications from an httpx client
inside dueflow's own process, so its rate and CPU are not like for like with
``benchmarks/http_place.py`` (wrk against ``dueflow serve``, the server's CPU from /proc). This
one measures notifications the way http_place.py measures placing.

Setup, not timed: a database (a new SQLite file, or --postgres-url emptied) seeded as
``payments.py``'s ``direct`` mode seeds it (its ``market`` and ``prepare``): --orders +
--warmup orders, each with a started and scanned payment attempt, half Alipay, half WeChat Pay;
each is paid at the simulator and its signed (and for WeChat Pay, encrypted) notification kept
as the simulator sends it, not delivered. The market's clock is moved to the real time first,
so the WeChat Pay timestamps (checked within 5 minutes) and the orders' deadlines match the
server's clock; the notifications are made last, just before the server starts. Their paths,
bodies and headers go to a file ``http_notify.lua`` reads, the providers alternating. The
orders' pay reminders come due 5 minutes after they were placed: a run whose setup and timed
phase last longer (too many --orders for the machine) fails its checks rather than count the
worker's reminders in the notifications' CPU.

Then ``dueflow serve`` (profile prod, the worker on unless --no-worker, ``--workers N`` with
--processes N) on that database, configured with the keys and ids the simulator signs with
(the ``DUEFLOW_ALIPAY_*`` and ``DUEFLOW_WECHATPAY_*`` settings of its client configuration; the
gateways point at a closed port, as nothing here should call them). wrk runs ``-t --threads -c
--connections``: --warmup notifications first (not recorded), then the timed phase, each
notification sent once, until they run out or --seconds pass; nothing is left in flight.

Reported per run, as http_place.py reports: notifications/s (2xx answers over wrk's duration),
latency p50 / p90 / p99 / max, answers other than 2xx by status, the server's CPU a
notification (its processes, from /proc, over the timed phase), statements a notification
(``dueflow_db_statements_total``; one process only), peak RSS. Then the database: as many orders
pending_shipment as notifications accepted and the rest still pending_payment, one ``pay`` event
each, the inbox's rows all ``confirmed`` and as many as the notifications.

``--with-place`` first runs http_place.py's dueflow measurement (its ``seed`` and ``one_run``,
no reference server) in the same sitting, on the same backend, and prints notifications/s over
orders/s and the CPU ratio.

    .venv/bin/python benchmarks/http_notify.py                          # SQLite, 10 s
    .venv/bin/python benchmarks/http_notify.py --with-place --seconds 8
    .venv/bin/python benchmarks/http_notify.py --backend postgres \
        --postgres-url postgresql://postgres@127.0.0.1/bench --processes 2 --with-place
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import _seed
import http_place
import payments
from dueflow.domain.deadlines import PROFILES
from dueflow.payments.simulator import SimulatorConfig
from http_tickets import free_port

LUA = Path(__file__).with_suffix(".lua")
#: Request headers wrk writes itself (or that describe the connection, not the notification).
OWN_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding"})
#: Where the served dueflow's provider clients would call: a closed port (the discard service),
#: so a call nobody expects fails at once instead of waiting on a name that does not resolve.
NOWHERE = "http://127.0.0.1:9"
#: How long after placing an order its pay reminder comes due (profile prod).
REMINDER = PROFILES["prod"].reminder


@dataclasses.dataclass(frozen=True)
class Notification:
    """One notification as the simulator sent it."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]

    def line(self) -> str:
        """Its line in the file http_notify.lua reads: path, body in hex, header names and
        values, tab separated."""
        fields = [self.path, self.body.hex()]
        for name, value in self.headers:
            if any(c in name + value for c in "\t\r\n"):
                raise ValueError(f"header {name!r} holds a tab or a line break")
            fields += [name, value]
        return "\t".join(fields)


# --- setup -----------------------------------------------------------------------------------


@contextlib.contextmanager
def simulator_configs() -> Iterator[list[SimulatorConfig]]:
    """Keep the configuration ``payments.market`` generates for its simulator (its keys and ids,
    which the served dueflow needs) while the block runs."""
    seen: list[SimulatorConfig] = []

    class Kept(SimulatorConfig):
        @classmethod
        def generate(cls, **options: Any) -> SimulatorConfig:
            config = SimulatorConfig.generate(**options)
            seen.append(config)
            return config

    # payments.market names the class it generates from as a global of its module.
    names = vars(payments)
    original, names["SimulatorConfig"] = names["SimulatorConfig"], Kept
    try:
        yield seen
    finally:
        names["SimulatorConfig"] = original


def provider_env(config: SimulatorConfig) -> dict[str, str]:
    """The ``DUEFLOW_*`` settings that let ``dueflow serve`` verify what ``config`` signs."""
    settings = dataclasses.asdict(config.client_config(NOWHERE))
    return {f"DUEFLOW_{name.upper()}": str(value) for name, value in settings.items()}


async def notifications(
    path: Path, database_url: str | None, count: int, parallel: int
) -> tuple[list[Notification], dict[str, str], datetime]:
    """``count`` orders paid at the simulator, half Alipay, half WeChat Pay, on a fresh database
    (``database_url`` emptied, or a new SQLite file at ``path``): their notifications, kept
    unsent, the providers alternating; the settings the server needs to accept them; and when
    the orders were placed."""
    with simulator_configs() as configs:
        async with payments.market(path, 32, database_url) as m:
            # The orders' deadlines and the notifications' timestamps on the server's clock.
            placed_at = datetime.now(UTC)
            m.clock.set(placed_at)
            started = await payments.prepare(m, count, parallel)
            m.forward.kept = []
            for provider in payments.PROVIDERS:
                for _, pay_no in started[provider]:
                    await payments.control(m, "pay", provider, pay_no)
            m.clock.set(datetime.now(UTC))
            await m.sim.post("/control/deliver")
            kept, m.forward.kept = m.forward.kept, None
    by_path: dict[str, list[Notification]] = {}
    for request in kept:
        headers = tuple((k, v) for k, v in request.headers.items() if k.lower() not in OWN_HEADERS)
        note = Notification(request.url.path, request.content, headers)
        by_path.setdefault(note.path, []).append(note)
    if sum(map(len, by_path.values())) != count:
        raise RuntimeError(f"{count} orders paid but {len(kept)} notifications kept")
    mixed: list[Notification] = []
    for n in range(max(map(len, by_path.values()), default=0)):
        mixed += [notes[n] for notes in by_path.values() if n < len(notes)]
    if database_url is None:
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    return mixed, provider_env(configs[0]), placed_at


# --- one run ---------------------------------------------------------------------------------


def wrk(
    args: argparse.Namespace, port: int, tmp: Path, notes: list[Notification]
) -> dict[str, Any]:
    """wrk with http_notify.lua over ``notes``; its NOTIFY line as a dict."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "requests.txt").write_text("".join(note.line() + "\n" for note in notes))
    # The bound; the script stops on its own at --seconds.
    command = _seed.wrk_command(
        args,
        port,
        LUA,
        int(args.seconds) + 120,
        work / "requests.txt",
        args.threads,
        max(1, round(args.seconds)),
    )
    return _seed.run_wrk(command, work, args.threads, "NOTIFY")


def measured(
    args: argparse.Namespace, port: int, pid: int, tmp: Path, notes: list[Notification]
) -> dict[str, Any]:
    """Warm up, then the timed phase with the server's CPU, statements and peak RSS (as
    http_place.measured, over notifications)."""
    counter = "dueflow_db_statements_total"
    warm = wrk(args, port, tmp, notes[: args.warmup])
    spy = None
    if args.py_spy:
        out = Path(args.py_spy) / f"notify-{args.backend}-p{args.processes}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [str(http_place.PY_SPY), "record", "--pid", str(pid), "--subprocesses"]
        command += ["--format", "raw", "--rate", "100", "--output", str(out)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # A scrape of /metrics runs statements of its own: two in a row say how many.
    s0 = http_place.statements(port, counter)
    s1 = http_place.statements(port, counter)
    cpu0 = http_place.cpu_seconds(pid)
    timed = wrk(args, port, tmp, notes[args.warmup :])
    cpu = http_place.cpu_seconds(pid) - cpu0
    s2 = http_place.statements(port, counter)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    return {
        "warm": warm,
        "timed": timed,
        "cpu": cpu,
        "statements": s2 - s1 - (s1 - s0),
        "peak": http_place.peak_rss_mib(pid),
    }


async def check(url: str, total: int, accepted: int) -> tuple[dict[str, Any], list[str]]:
    """The database after a run of ``total`` prepared orders of which ``accepted`` were
    notified (2xx): what it holds, and what is wrong with it."""
    from dueflow import bootstrap
    from dueflow.config import load_settings

    settings = load_settings(database_url=url, profile="prod")
    async with bootstrap.running(settings, migrate_sqlite=False) as deps:
        statuses = await payments.statuses(deps)
        pays = await payments.events_per_order(deps, "pay")
        outcomes = await payments.inbox(deps)
    failed = []
    expected = {"pending_shipment": accepted, "pending_payment": total - accepted}
    if statuses != {k: v for k, v in expected.items() if v}:
        failed.append(f"orders by status {statuses}, expected {expected}")
    if pays != ({1: accepted} if accepted else {}):
        failed.append(f"orders by their count of pay events {pays}, expected {{1: {accepted}}}")
    if outcomes != ({"confirmed": accepted} if accepted else {}):
        failed.append(f"inbox rows by outcome {outcomes}, expected {{'confirmed': {accepted}}}")
    state = {"statuses": statuses, "pay_events_per_order": pays, "inbox": outcomes}
    return state, failed


def one_run(
    args: argparse.Namespace,
    url: str,
    env: dict[str, str],
    tmp: Path,
    notes: list[Notification],
    placed_at: datetime,
) -> dict[str, Any]:
    """Serve ``url`` with the providers' settings ``env``, warm up, notify for the timed phase,
    check the database. The orders were placed at ``placed_at``: their pay reminders, due
    :data:`REMINDER` later, must not have come due (the worker would have run them in the
    timed phase, and its CPU is counted)."""
    port = free_port()
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    server_env.update(env)
    server_env.update({"DUEFLOW_DATABASE_URL": url, "DUEFLOW_PROFILE": "prod"})
    log = tmp / "dueflow-notify.log"
    with _seed.serving(server_env, port, log, worker=args.worker, workers=args.processes) as proc:
        m = measured(args, port, proc.pid, tmp, notes)
    warm, timed = m["warm"], m["timed"]
    accepted = timed["accepted"]
    seconds = timed["duration_us"] / 1e6
    state, failed = asyncio.run(check(url, len(notes), warm["accepted"] + accepted))
    if datetime.now(UTC) >= placed_at + REMINDER:
        failed.append("the orders' pay reminders came due before the end: fewer --orders")
    for phase, result in (("warm-up", warm), ("timed", timed)):
        if result["sent"] != result["answered"]:
            failed.append(f"{phase}: sent {result['sent']}, answered {result['answered']}")
        if result["non_2xx"]:
            failed.append(f"{phase}: answers other than 2xx: {result['non_2xx']}")
    return {
        "server": "dueflow notify",
        "database": url.split(":", 1)[0],
        "processes": args.processes,
        "worker": args.worker,
        "connections": args.connections,
        "notifications": accepted,
        "non_2xx": timed["non_2xx"],
        "seconds": round(seconds, 2),
        "notifications_per_s": round(accepted / seconds, 1) if seconds else None,
        "p50_ms": round(timed["p50_us"] / 1000, 2),
        "p90_ms": round(timed["p90_us"] / 1000, 2),
        "p99_ms": round(timed["p99_us"] / 1000, 2),
        "max_ms": round(timed["max_us"] / 1000, 2),
        "server_cpu_ms_per_notification": (
            round(m["cpu"] * 1000 / accepted, 3) if accepted else None
        ),
        "statements_per_notification": (
            round(m["statements"] / accepted, 2) if accepted and args.processes == 1 else None
        ),
        "server_peak_rss_mib": round(m["peak"], 1),
        "transport_errors": {
            k: timed[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts")
        },
        "other_answers": timed["other_answers"],
        "db": state,
        "failed": failed,
        "ok": not failed,
    }


def place_run(args: argparse.Namespace, url: str, tmp: Path) -> dict[str, Any]:
    """http_place.py's dueflow measurement (each buyer by its own token) on ``url``, seeded
    afresh with --place-orders + --warmup goods."""
    tokens = [secrets.token_urlsafe(24) for _ in range(args.buyers)]
    (tmp / "tokens.txt").write_text(http_place.credential_lines("token", tokens, ""))
    goods = asyncio.run(http_place.seed(url, tokens, args.place_orders + args.warmup))
    place_args = argparse.Namespace(**{**vars(args), "orders": args.place_orders})
    return http_place.one_run("dueflow", place_args, url, tmp, goods, "token")


# --- the whole benchmark ---------------------------------------------------------------------


def table(notify: dict[str, Any], place: dict[str, Any] | None) -> str:
    lines = [
        "| run | database | processes | answered 2xx/201 | other | per s | p50 / p90 / p99 / max "
        "(ms) | server CPU ms each | statements each | peak RSS (MiB) | checks |",
        "|" + "---|" * 11,
    ]
    rows = [("notify", notify, "notifications", "non_2xx", "notification")]
    if place is not None:
        rows.insert(0, ("place", place, "placed", "non_201", "order"))
    for name, r, count, bad, each in rows:
        other = ", ".join(f"{k}: {v}" for k, v in r[bad].items()) or "0"
        rate = r["notifications_per_s" if name == "notify" else "orders_per_s"]
        lines.append(
            f"| {name} | {r['database']} | {r['processes']} | {r[count]:,} | {other} | {rate} "
            f"| {r['p50_ms']} / {r['p90_ms']} / {r['p99_ms']} / {r['max_ms']} "
            f"| {r[f'server_cpu_ms_per_{each}']} | {r[f'statements_per_{each}']} "
            f"| {r['server_peak_rss_mib']} | {'ok' if r['ok'] else 'FAILED'} |"
        )
    return "\n".join(lines)


def ratio(notify: dict[str, Any], place: dict[str, Any]) -> dict[str, float | None]:
    """Notifications/s over orders/s, and the CPU of a notification over an order's."""

    def over(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    return {
        "per_s": over(notify["notifications_per_s"], place["orders_per_s"]),
        "cpu_each": over(
            notify["server_cpu_ms_per_notification"], place["server_cpu_ms_per_order"]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--postgres-url", default=http_place.URLS["postgres"])
    parser.add_argument("--orders", type=int, default=4_000, help="paid orders for the timed phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="at most this long a run")
    parser.add_argument("--warmup", type=int, default=200, help="sent first, not timed")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--processes", type=int, default=1, help="server processes (--workers)")
    parser.add_argument(
        "--worker",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run dueflow's worker, scanner and feeder beside the API (dueflow serve's default)",
    )
    parser.add_argument(
        "--setup-parallel", type=int, default=16, help="orders set up at once (not timed)"
    )
    parser.add_argument(
        "--with-place",
        action="store_true",
        help="first run http_place.py's dueflow measurement and print the ratios",
    )
    parser.add_argument("--place-orders", type=int, default=20_000, help="goods for --with-place")
    parser.add_argument("--buyers", type=int, default=50, help="buyers for --with-place")
    parser.add_argument("--py-spy", default=None, help="directory for py-spy raw stacks")
    args = parser.parse_args()
    if args.processes > 1 and args.backend == "sqlite":
        sys.exit("SQLite has one writer: --processes stays 1 on it")
    http_place.ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="dueflow-http-notify-") as name:
        tmp = Path(name)
        database_url = args.postgres_url if args.backend == "postgres" else None
        place = None
        if args.with_place:
            url = database_url or f"sqlite:///{tmp / 'place.db'}"
            place = place_run(args, url, tmp)
            print(json.dumps(place), flush=True)
        started = time.perf_counter()
        path = tmp / "notify.db"
        notes, env, placed_at = asyncio.run(
            notifications(path, database_url, args.orders + args.warmup, args.setup_parallel)
        )
        print(
            f"prepared {len(notes):,} notifications in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        notify = one_run(args, database_url or f"sqlite:///{path}", env, tmp, notes, placed_at)
        print(json.dumps(notify), flush=True)
    print(table(notify, place))
    ratios = ratio(notify, place) if place is not None else {}
    if ratios:
        print(
            f"notifications / placing: per second {ratios['per_s']}, "
            f"server CPU each {ratios['cpu_each']}"
        )
    ok = notify["ok"] and (place is None or place["ok"])
    print(json.dumps({"notify": notify, "place": place, "ratio": ratios, "ok": ok}), flush=True)
    if not ok:
        print("HTTP NOTIFY CHECK FAILED: see failed in the runs above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
