"""``dueflow serve``: the command (the server and its process supervisor are imported when it
runs)."""

from __future__ import annotations

import typer

from dueflow.cli._common import configure_logging, err, run, settings_or_exit


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port."),
    workers: int = typer.Option(
        1,
        min=1,
        max=64,
        help="API processes sharing the port (PostgreSQL and MySQL; SQLite serves one). The "
        "worker still runs once, in the process that starts them.",
    ),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve HTTP only."),
    dev_users: bool = typer.Option(
        False,
        "--dev-users",
        help="Print fresh tokens for users admin (an admin), alice and bob, creating them if "
        "missing (their earlier tokens stop working).",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """Serve the HTTP app (on uvloop and httptools) with the worker, the scanner and the feeder.
    In the dev profile with no provider configured, the payment simulator is mounted at /sim
    and its keys are handed to dueflow's settings."""
    from dueflow.cli import server, supervisor

    settings = settings_or_exit()
    configure_logging(verbose, settings, serving=True)
    run(
        supervisor.serve(
            settings,
            host=host,
            port=port,
            worker=not no_worker,
            dev_users=dev_users,
            workers=workers,
            verbose=verbose,
            console=err,
        ),
        loop_factory=server.new_event_loop,
    )
