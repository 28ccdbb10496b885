"""``dueflow worker`` (run timers as they come due, the scanner, the feeder, the reconciler and the
event sender until a signal) and ``dueflow scan`` (one scanner pass)."""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING, Any

import typer

from dueflow.cli._common import (
    configure_logging,
    err,
    out,
    run,
    settings_or_exit,
    with_deps,
)
from dueflow.cli._lazy import bootstrap, migrations, reconciler, report, webhooks

if TYPE_CHECKING:
    from dueflow.service.deps import Deps


def scan() -> None:
    """Run one scanner pass: fire timers the trigger missed and claims whose lease expired."""
    from dueflow.worker.runner import Worker
    from dueflow.worker.scanner import scan_once

    async def go(deps: Deps) -> Any:
        return await scan_once(Worker(deps))

    result = run(with_deps(settings_or_exit(), go))
    out.print(
        f"scan: claimed {result.claimed} timers in {result.batches} batches, "
        f"{result.failed_batches} failed, {result.errors} errors, {result.seconds * 1000:.1f} ms"
    )


def worker(
    concurrency: int = typer.Option(1, min=1, max=64, help="Concurrent claim loops."),
    no_scanner: bool = typer.Option(False, "--no-scanner", help="Do not run the scanner here."),
    metrics_port: int | None = typer.Option(
        None, min=0, max=65535, help="Serve /metrics on this TCP port (0: any free one)."
    ),
    metrics_host: str = typer.Option("127.0.0.1", help="Interface /metrics listens on."),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Run timers as they come due, and the scanner, until SIGINT or SIGTERM."""
    from dueflow.metrics import exposition
    from dueflow.worker.runner import Worker, run_feeder
    from dueflow.worker.scanner import run_scanner

    settings = settings_or_exit()
    configure_logging(verbose, settings)

    async def go(deps: Deps) -> None:
        await migrations.require_head(deps.db)  # exits 2 over a schema not migrated
        sock = None if metrics_port is None else exposition.listen(metrics_host, metrics_port)

        async def refresh_gauges() -> None:
            deps.metrics.record_snapshot(await report.snapshot(deps))

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def shut_down() -> None:
            stop.set()
            deps.trigger.wake()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, shut_down)
        runner = Worker(deps)
        tasks = [asyncio.create_task(runner.run(stop)) for _ in range(concurrency)]
        if not no_scanner:
            tasks.append(asyncio.create_task(run_scanner(runner, stop)))
            tasks += reconciler.start(deps, stop)
        tasks.append(asyncio.create_task(run_feeder(runner, stop)))
        tasks += webhooks.start(deps, bootstrap.build_event_webhook(settings), stop)
        if sock is not None:
            scrape = exposition.metrics_app(deps.metrics, refresh_gauges)
            tasks.append(asyncio.create_task(exposition.serve_metrics(scrape, sock, stop)))
            err.print(f"metrics on http://{metrics_host}:{sock.getsockname()[1]}/metrics")
        err.print(f"worker {runner.name} running ({concurrency} loops); Ctrl-C stops")
        await asyncio.gather(*tasks)
        err.print(f"worker stopped after {runner.stats.claimed} timers")

    run(with_deps(settings, go))
