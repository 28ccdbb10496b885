"""The provider notify routes (``POST /notify/...``), reached without walking FastAPI's router.

The routes in :mod:`dueflow.api.notify` stay the one truth of what a notification is answered
and of the OpenAPI document; they come after about 150 other routes there, and matching a
request against each of those took about 8 % of a notification's CPU (docs/benchmarks.md,
"Notifications and the flash rush: hot statements, holds last"). This plain ASGI layer, between
the app's outer middleware (``_Timed`` in :mod:`dueflow.api.app`: request id, latency, access
log) and FastAPI's stack, matches a ``POST`` to one of the three notify paths first and calls
that route's own endpoint with the request, as the route would: the endpoint takes nothing but
the ``Request`` (no dependencies, no body model, no validation), so what FastAPI's stack adds
around it is the routing, the dependency solving of no dependencies, and the exception
handlers, which this layer calls itself, the same ones (:mod:`dueflow.api.errors`).

Any other request, and every request while tracing is on (FastAPI's own span names the route),
goes to FastAPI as it came. The body is not read here: the endpoint reads it, with its own
limit, so a notification is kept in the inbox as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from dueflow import tracing
from dueflow.api import common, errors
from dueflow.exceptions import DueflowError

log = logging.getLogger(__name__)

#: The notify paths this layer takes (every one a ``POST``; see :mod:`dueflow.api.notify`).
PATHS = ("/notify/alipay", "/notify/wechatpay", "/notify/wechatpay/refund")

Endpoint = Callable[[Request], Awaitable[Response]]


class HotNotify:
    """The ASGI layer handing a provider's notification straight to its route's endpoint."""

    def __init__(self, app: ASGIApp, routes: Iterable[APIRoute]) -> None:
        self.app = app
        self.routes: dict[str, tuple[APIRoute, Endpoint]] = {
            route.path: (route, cast(Endpoint, route.endpoint)) for route in routes
        }
        if sorted(self.routes) != sorted(PATHS):
            raise RuntimeError(f"notify routes {sorted(self.routes)}, expected {PATHS}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if found is None or scope["method"] != "POST" or tracing.on():
            await self.app(scope, receive, send)
            return
        route, endpoint = found
        # What the router leaves in the scope for the access log, the metrics and the handlers.
        scope["route"] = route
        scope["endpoint"] = endpoint
        scope["path_params"] = {}
        request = Request(scope, receive, send)
        try:
            answer = await endpoint(request)
        except DueflowError as error:
            # What the route's exception handling answers (a backend that cannot be reached
            # while the inbox row is written, say): the error JSON of the same handler.
            answer = await errors.dueflow_error(request, error)
        except Exception:
            # As Starlette's outermost middleware does: the 500 in the error JSON, then raised
            # on (the app's outer layer logs it once, with the request id).
            failed: Any = await errors.unexpected_error(request, Exception())
            await failed(scope, receive, send)
            raise
        await answer(scope, receive, send)


def routes_of(app: Any) -> list[APIRoute]:
    """The notify routes of the FastAPI ``app``, as the router puts them in a request's scope."""
    return [
        route
        for route in common.every_route(app)
        if isinstance(route, APIRoute) and route.path in PATHS and "POST" in (route.methods or ())
    ]
