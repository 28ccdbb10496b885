"""The dueflow server as the HTTP demos see it: calls with bearer tokens, errors as
:class:`Refused`, the server's clock, the checks before a run (an admin's token, the simulator
mounted), users made by the admin, order views and the admin summary's figures and invariants.

Private to :mod:`dueflow.demo.http`, which re-exports all of it for the HTTP demos.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from dueflow.error_codes import ErrorCode
from dueflow.exceptions import DomainError, DueflowError
from dueflow.service.report import Invariants, Snapshot


class BadServer(DomainError):
    """The server cannot be used for the demo (unreachable, not dueflow, wrong admin token)."""

    code = ErrorCode.BAD_SERVER


class Stale(Exception):
    """An order the server left where it was long past its deadline."""


class ServerLost(DueflowError):
    """The server stopped answering sensibly during the demo."""

    code = ErrorCode.SERVER_LOST


class Refused(Exception):
    """An API or simulator call answered with an error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def refusal(response: httpx.Response) -> Refused:
    """The error an API or simulator answer carries (its code and message, or its status)."""
    try:
        error = response.json()["error"]
        return Refused(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return Refused(response.status_code, f"http_{response.status_code}", response.text[:200])


def dates_of(view: Mapping[str, Any]) -> dict[str, Any]:
    """An order view with its times (``*_at``, ``*_deadline``) as datetimes."""
    return {
        key: datetime.fromisoformat(value)
        if isinstance(value, str) and key.endswith(("_at", "_deadline"))
        else value
        for key, value in view.items()
    }


class Server:
    """The dueflow server over HTTP, and its clock."""

    def __init__(self, client: httpx.AsyncClient, admin_token: str) -> None:
        self.client = client
        self.admin = admin_token
        self.offset = timedelta(0)

    async def call(self, method: str, path: str, token: str | None = None, body: Any = None) -> Any:
        """The JSON answer of a call; :class:`Refused` for an error answer."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = await self.client.request(method, path, json=body, headers=headers)
        if response.status_code >= 400:
            raise refusal(response)
        return response.json()

    async def summary(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self.call("GET", "/api/admin/summary", self.admin)
        return answer

    async def view(self, order_id: int) -> dict[str, Any]:
        return dates_of(await self.call("GET", f"/api/orders/{order_id}", self.admin))

    def now(self) -> datetime:
        """The server's time, by this clock and the offset measured at the start."""
        return datetime.now(UTC) + self.offset

    async def sleep_until(self, when: datetime) -> None:
        delay = (when - self.now()).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)

    async def check(self, url: str) -> None:
        """Fail with :class:`BadServer` unless ``url`` answers the admin summary to the admin
        token; measure the offset of the server's clock from this one."""
        try:
            sent = datetime.now(UTC)
            summary = await self.summary()
            received = datetime.now(UTC)
        except httpx.HTTPError as exc:
            raise BadServer(f"cannot reach dueflow at {url}: {_describe(exc)}") from None
        except Refused as exc:
            if exc.status == 401:
                raise BadServer(f"the admin token is not valid at {url} ({exc.message})") from None
            if exc.status == 403:
                raise BadServer(f"the token given is not an admin's at {url}") from None
            if exc.status == 404:
                raise BadServer(f"{url} is not a dueflow server (no /api/admin/summary)") from None
            raise BadServer(f"{url} answered {exc}") from None
        except ValueError:
            raise BadServer(f"{url} does not answer like dueflow (not JSON)") from None
        if not isinstance(summary, dict) or "at" not in summary:
            raise BadServer(f"{url} does not answer like dueflow serve")
        self.offset = datetime.fromisoformat(summary["at"]) - (sent + (received - sent) / 2)


async def _check_simulator(server: Server, url: str) -> None:
    try:
        await server.call("GET", "/sim/control/keys")
    except Refused:
        raise BadServer(
            f"no payment simulator at {url}/sim: run `dueflow serve` with DUEFLOW_PROFILE=dev "
            "and no payment provider configured"
        ) from None


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


@contextlib.asynccontextmanager
async def connected(url: str, admin_token: str) -> AsyncIterator[Server]:
    """The dueflow server at ``url``, checked (an admin's token, the simulator mounted); a
    failure inside is translated as :func:`run` says.

    Raises:
        BadServer: ``url`` is not a usable dueflow server, or the token is not an admin's.
        ServerLost: the server stopped answering inside.
    """
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise BadServer(f"--url must look like http://HOST:PORT, not {url!r}")
    limits = httpx.Limits(max_connections=32)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
            server = Server(client, admin_token)
            await server.check(url)
            await _check_simulator(server, url)
            yield server
    except httpx.InvalidURL as exc:
        raise BadServer(f"--url {url!r} is not a valid URL: {exc}") from None
    except Refused as exc:
        raise ServerLost(f"the server at {url} refused the demo: {exc}") from None
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerLost(f"the demo lost the server at {url}: {_describe(exc)}") from None


async def add_user(server: Server, name: str) -> str:
    """A new user made by the admin; their token."""
    made = await server.call("POST", "/api/admin/users", server.admin, {"name": name})
    return str(made["token"])


async def gather_views(server: Server, order_ids: list[int]) -> list[dict[str, Any]]:
    """The views of these orders, eight requests at a time."""
    limit = asyncio.Semaphore(8)

    async def one(order_id: int) -> dict[str, Any]:
        async with limit:
            return await server.view(order_id)

    return list(await asyncio.gather(*(one(order_id) for order_id in order_ids)))


def invariants_of(summary: Mapping[str, Any]) -> Invariants:
    """The invariants of an admin summary (the whole server's)."""
    checked = summary["invariants"]
    return Invariants(**{f.name: list(checked.get(f.name, [])) for f in fields(Invariants)})


def snapshot(summary: Mapping[str, Any]) -> Snapshot:
    """The figures of an admin summary, as the live view shows them."""
    return Snapshot(
        at=datetime.fromisoformat(summary["at"]),
        orders=dict(summary["orders"]),
        timers=dict(summary["timers"]),
        overdue=int(summary["overdue"]),
        stuck=int(summary["stuck"]),
        refunds=dict(summary["refunds"]),
        discrepancies=int(summary["discrepancies"]),
    )
