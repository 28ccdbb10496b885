"""What the access log costs a request: ``GET /healthz`` (the cheapest route: no database)
through dueflow's whole ASGI app in process, no socket, with the access log on (JSON lines to a
file, as ``dueflow serve`` writes them with DUEFLOW_LOG_FORMAT=json) and off, and with
``--before REF`` the app of ``api/app.py`` at that git revision too (over this tree's other
modules), in alternating rounds.

Each round sends --requests requests one after another and times them with
``time.process_time`` (CPU of this process); the requests of one round of two carry their own
``X-Request-Id``, so both ways of getting an id are in the figure. Printed: the median of each
kind's rounds in microseconds a request, and the ratios.

    .venv/bin/python benchmarks/access_log.py --rounds 10 --requests 1000 --before main
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from dueflow import bootstrap, logs
from dueflow.api.app import create_app
from dueflow.config import load_settings


async def round_of(app: Any, requests: int, sent_id: bool) -> float:
    """CPU seconds of ``requests`` calls of ``GET /healthz``."""
    headers = [(b"host", b"dueflow"), (b"user-agent", b"bench")]
    answered: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answered.append(message["status"])

    started = time.process_time()
    for n in range(requests):
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/healthz",
            "raw_path": b"/healthz",
            "query_string": b"",
            "root_path": "",
            "headers": [*headers, (b"x-request-id", b"bench-%d" % n)] if sent_id else headers,
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000),
        }
        await app(scope, receive, send)
    took = time.process_time() - started
    assert answered == [200] * requests, set(answered)
    return took


def app_at(revision: str, tmp: Path) -> Any:
    """The ``create_app`` of ``api/app.py`` at ``revision``."""
    source = subprocess.run(
        ["git", "show", f"{revision}:src/dueflow/api/app.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = tmp / "app_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("app_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.create_app


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(database_url=f"sqlite:///{Path(tmp) / 'bench.db'}")
        before = app_at(args.before, Path(tmp)) if args.before else None
        async with bootstrap.running(settings) as deps:
            app = create_app(deps)
            old = before(deps) if before else None
            handler = logging.FileHandler(Path(tmp) / "access.log")
            handler.setFormatter(logs.JsonFormatter())
            handler.addFilter(logs.ContextFilter())
            access = logging.getLogger(logs.ACCESS)
            access.addHandler(handler)
            access.propagate = False
            for warm in (app, old):  # the middleware stacks are built
                if warm is not None:
                    await round_of(warm, args.requests, True)
            rounds: dict[str, list[float]] = {"on": [], "off": [], "before": []}
            for n in range(args.rounds):
                for kind in rounds:
                    access.setLevel(logging.INFO if kind == "on" else logging.WARNING)
                    if kind == "before" and old is None:
                        continue
                    took = await round_of(
                        old if kind == "before" else app, args.requests, sent_id=n % 2 == 0
                    )
                    rounds[kind].append(took / args.requests * 1e6)
            lines = sum(1 for _ in (Path(tmp) / "access.log").open())
    on, off = (statistics.median(rounds[k]) for k in ("on", "off"))
    print(f"access log on:  {on:.1f} us a request (median of {args.rounds} rounds)")
    print(f"access log off: {off:.1f} us a request; on / off {on / off:.3f}")
    print(f"the access line: {on - off:.1f} us a request ({lines:,} lines written)")
    if rounds["before"]:
        old_median = statistics.median(rounds["before"])
        print(
            f"{args.before}: {old_median:.1f} us a request; on / before {on / old_median:.3f}, "
            f"off / before {off / old_median:.3f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--before", default=None, help="a git revision to compare with")
    asyncio.run(main(parser.parse_args()))
