"""What every command group of :mod:`dueflow.cli` shares: the output consoles, the settings (exit
2 when they are wrong), running a command's coroutine (dueflow's errors become a message and an
exit status), the dependencies of a command, one-line and comment options, and logging. The
modules a command imports when it runs are in :mod:`dueflow.cli._lazy`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from dueflow.cli._lazy import bootstrap
from dueflow.domain import text
from dueflow.exceptions import ConfigError, DomainError, DueflowError

if TYPE_CHECKING:
    from dueflow.config import Settings
    from dueflow.service.deps import Deps

T = TypeVar("T")

out = Console()
err = Console(stderr=True)


def settings_or_exit(**overrides: Any) -> Settings:
    """The settings from the environment (and ``overrides``); a bad one is a message and exit
    status 2."""
    from dueflow.config import load_settings

    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {exc.message}", soft_wrap=True)  # one line to grep
        raise typer.Exit(2) from None


def run(
    coro: Coroutine[Any, Any, T],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run a coroutine (on a loop of ``loop_factory``, asyncio's by default), turning dueflow's
    errors into a message and an exit status (2 for bad input or settings, 1 for everything
    else)."""
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(coro)
    except (ConfigError, DomainError) as exc:
        err.print(f"[red]error:[/red] {exc.message}", soft_wrap=True)
        raise typer.Exit(2) from None
    except DueflowError as exc:
        err.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None


def one_line(value: str | None) -> str | None:
    """A one-line text option as :mod:`dueflow.domain.text` allows it (a usage error, exit 2,
    naming the option otherwise)."""
    problem = None if value is None else text.refused_character(value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value


def multiline(value: str) -> str:
    """A multi-line text option (a comment): tab and line breaks are kept."""
    problem = text.refused_character(value, multiline=True)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value


async def with_deps(settings: Settings, action: Callable[[Deps], Awaitable[T]]) -> T:
    """Run ``action`` with the dependencies these settings choose, closed after it."""
    async with bootstrap.running(settings) as deps:
        return await action(deps)


def configure_logging(verbose: bool, settings: Settings, *, serving: bool = False) -> None:
    """Log lines as the settings say (JSON lines or text), debug ones too with ``verbose``;
    when ``serving`` HTTP, the access log unless the settings turn it off."""
    from dueflow import logs

    logs.configure(
        verbose=verbose,
        json_lines=settings.log_format == "json",
        access_log=serving and settings.access_log,
    )
