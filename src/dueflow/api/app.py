"""The ASGI application: the buyer, seller and admin API, the provider notify routes, health."""

from __future__ import annotations

import logging
import re
import secrets
import time
from datetime import timedelta
from typing import Any, cast
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueflow import logs, tracing
from dueflow.api import (
    admin,
    admin_pages,
    common,
    errors,
    events,
    goods,
    hot_notify,
    hot_place,
    keys,
    lists,
    notify,
    orders,
    refunds,
    shop,
    shows,
    tickets,
    webhooks,
)
from dueflow.service import readiness, report
from dueflow.service.deps import Deps


def create_app(
    deps: Deps,
    *,
    session_secret: str | None = None,
    session_ttl: timedelta | None = None,
    secure_cookies: bool = False,
) -> FastAPI:
    """dueflow's HTTP app over already wired ``deps`` (the caller owns their lifetime). The
    admin pages sign sessions with ``session_secret`` (a random one when None: sessions then
    end when the process does); ``secure_cookies`` for a deployment behind HTTPS."""
    app = FastAPI(title="dueflow", version="0.1.0", telemetry=_telemetry())
    errors.install(app)
    # The order of the routers is the order of the OpenAPI document's paths.
    app.include_router(goods.router(deps))
    app.include_router(orders.router(deps))
    app.include_router(admin.router(deps))
    app.include_router(lists.router(deps))
    app.include_router(refunds.router(deps))
    app.include_router(keys.router(deps))
    app.include_router(shows.router(deps))
    app.include_router(tickets.router(deps))
    app.include_router(shop.router(deps))
    app.include_router(events.router(deps))
    app.include_router(webhooks.router(deps))
    events.webhooks(app)
    app.include_router(notify.router(deps))
    app.include_router(
        admin_pages.router(
            deps,
            secret=session_secret.encode() if session_secret else None,
            ttl=session_ttl,
            secure=secure_cookies,
        )
    )

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the process answers (it checks nothing else)."""
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: the database answers at the schema's head revision and the trigger's
        backend answers; otherwise 503 naming each part that is not ready."""
        problems = await readiness.not_ready(deps)
        if problems:
            return JSONResponse({"status": "unavailable", "not_ready": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> Response:
        deps.metrics.record_snapshot(await report.snapshot(deps))
        return Response(deps.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # Outside every middleware of the app's own, the unexpected error's 500 included: that
    # answer carries the request id and is timed and logged like any other.
    # Inside it, the plain place of goods is taken off FastAPI's stack (api/hot_place.py),
    # and the provider notifications skip its router (api/hot_notify.py).
    build = app.build_middleware_stack
    place = _place_route(app)
    notified = hot_notify.routes_of(app)
    app.build_middleware_stack = lambda: _Timed(  # type: ignore[method-assign]
        hot_notify.HotNotify(hot_place.HotPlace(build(), deps, place), notified), deps
    )
    _add_links(app)
    return app


def _place_route(app: FastAPI) -> APIRoute:
    """The route ``POST /api/orders``, as the router puts it in a request's scope."""
    for route in common.every_route(app):
        if _is_place(route):
            return cast(APIRoute, route)
    raise RuntimeError(f"no route POST {hot_place.PATH}")


def _is_place(route: Any) -> bool:
    return (
        isinstance(route, APIRoute)
        and route.path == hot_place.PATH
        and "POST" in (route.methods or ())
    )


def _telemetry() -> TelemetryConfig:
    """FastAPI's own span per request (named by method and route template, its status, taking
    an incoming ``traceparent``) on dueflow's tracer provider, and nothing else of FastAPI's
    telemetry; while tracing is off, none at all (the app is called as it was)."""
    provider = tracing.provider()
    return {
        "tracing": provider is not None,
        "tracer_provider": provider,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": False,
    }


def _link(method: str, path: str, body: Any = None, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to the operation ``method path``: its parameters (and request body
    fields) taken from the answer by runtime expressions such as ``$response.body#/id``."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    link: dict[str, Any] = {"operationRef": f"#/paths/{quote(pointer, safe='~')}/{method}"}
    if parameters:
        link["parameters"] = parameters
    if body is not None:
        link["requestBody"] = body
    return link


def _order_links(order_id: str) -> dict[str, dict[str, Any]]:
    """From an answer about an order to everything done to it next."""
    order = "/api/orders/{order_id}"
    return {
        "GetOrder": _link("get", order, order_id=order_id),
        "StartPayment": _link("post", f"{order}/payments", order_id=order_id),
        "CancelOrder": _link("post", f"{order}/cancel", order_id=order_id),
        "ShipOrder": _link("post", f"{order}/ship", order_id=order_id),
        "ConfirmReceipt": _link("post", f"{order}/confirm-receipt", order_id=order_id),
        "ReviewOrder": _link("post", f"{order}/reviews", order_id=order_id),
    }


ID = "$response.body#/id"
PLACE = "/api/orders"

#: The links of each operation's success answer (by method and path): from what it created or
#: moved to the operations that read or act on it, so a client (and schemathesis's stateful
#: tests) can walk an order's life from the schema alone.
LINKS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("post", "/api/goods"): {
        "GetGoods": _link("get", "/api/goods/{goods_id}", goods_id=ID),
        "OrderGoods": _link("post", PLACE, {"goods_id": ID}),
    },
    ("post", PLACE): _order_links(ID),
    ("post", "/api/orders/{order_id}/payments"): _order_links("$request.path.order_id"),
    ("post", "/api/orders/{order_id}/cancel"): _order_links(ID),
    ("post", "/api/orders/{order_id}/ship"): _order_links(ID),
    ("post", "/api/orders/{order_id}/confirm-receipt"): _order_links(ID),
    ("post", "/api/orders/{order_id}/reviews"): _order_links("$response.body#/order/id"),
    ("post", "/api/shows"): {
        "GetShow": _link("get", "/api/shows/{show_id}", show_id=ID),
        "GetSeats": _link("get", "/api/shows/{show_id}/seats", show_id=ID),
        "CancelShow": _link("post", "/api/shows/{show_id}/cancel", show_id=ID),
    },
    ("get", "/api/shows/{show_id}/seats"): {
        "OrderSeat": _link(
            "post",
            PLACE,
            {"show_id": "$response.body#/show_id", "seats": ["$response.body#/seats/0/label"]},
        ),
    },
    ("post", "/api/skus"): {
        "GetSku": _link("get", "/api/skus/{sku_id}", sku_id=ID),
        "RestockSku": _link("post", "/api/skus/{sku_id}/restock", sku_id=ID),
        "OrderSku": _link("post", PLACE, {"lines": [{"sku_id": ID, "quantity": 1}]}),
        "AddFlashSale": _link("post", "/api/flash-sales", {"sku_id": ID}),
    },
    ("post", "/api/coupon-templates"): {
        "GetTemplate": _link("get", "/api/coupon-templates/{template_id}", template_id=ID),
        "IssueCoupon": _link("post", "/api/coupon-templates/{template_id}/issue", template_id=ID),
    },
    ("post", "/api/flash-sales"): {
        "GetFlashSale": _link("get", "/api/flash-sales/{sale_id}", sale_id=ID),
        "OrderFlashSale": _link("post", PLACE, {"flash_sale_id": ID, "quantity": 1}),
    },
}


def _add_links(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI schema carry :data:`LINKS` on each operation's success answer
    (FastAPI has no place for links in a route's declaration)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = generate()  # which FastAPI keeps as app.openapi_schema
        for (method, path), links in LINKS.items():
            responses = spec["paths"][path][method]["responses"]
            [success] = [code for code in responses if code.startswith("2")]
            responses[success]["links"] = links
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


log = logging.getLogger(__name__)
access = logging.getLogger(logs.ACCESS)
#: A request id a client (or a proxy in front) may send: printable ASCII without spaces, up to
#: 128 characters; any other is replaced by one of ours.
REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")


class _Timed:
    """Every HTTP request in one pass, as plain ASGI (a ``BaseHTTPMiddleware`` would start a
    task group for every request and every body read): its latency by method, route and status,
    its request id (the ``X-Request-Id`` sent, or made) bound to every line logged while it is
    served and echoed in the answer, and its line in the access log."""

    #: Latency series kept at hand, at most this many (methods are the client's to choose).
    KEPT_SERIES = 256

    def __init__(self, app: ASGIApp, deps: Deps) -> None:
        self.app = app
        self.deps = deps
        # (method, route, status) -> its latency series: prometheus_client's labels() takes a
        # lock and builds its key each call (measured: ~2% of a place's CPU).
        self._series: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0  # until the app starts an answer
        request_id = _request_id(scope)

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id)]
            await send(message)

        with logs.bound(request_id=request_id.decode()):
            try:
                await self.app(scope, receive, sent)
            except Exception as error:
                if status:
                    # The answer (the 500) is given: the traceback is logged here, where it
                    # carries the request id, and the server's own line of it is dropped. It is
                    # raised on all the same, as ASGI has it (a test client sees it).
                    log.exception(
                        "unexpected error answering %s %s", scope["method"], scope["path"]
                    )
                    logs.logged(error)
                raise
            finally:
                took = time.perf_counter() - started
                # The router writes the matched route into the scope it was given.
                route = getattr(scope.get("route"), "path", "unmatched")
                self._latency(scope["method"], route, status or 500).observe(took)
                if access.isEnabledFor(logging.INFO):
                    _log_access(scope, route, status or 500, took)

    def _latency(self, method: str, route: str, status: int) -> Any:
        """The latency series of ``method``, ``route`` and ``status``."""
        key = (method, route, status)
        series = self._series.get(key)
        if series is None:
            series = self.deps.metrics.http_latency.labels(method, route, str(status))
            if len(self._series) < self.KEPT_SERIES:
                self._series[key] = series
        return series


def _request_id(scope: Scope) -> bytes:
    """The request's ``X-Request-Id`` when it is one we take, else a new one (16 hex digits)."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if REQUEST_ID.fullmatch(value):
                return bytes(value)
            break
    return secrets.token_hex(8).encode()


def _log_access(scope: Scope, route: str, status: int, took: float) -> None:
    """The access line of a request: who made it is what the authentication kept in the
    request's state (``request.state.user``, ``.key_id``)."""
    state = scope.get("state") or {}
    user = state.get("user")
    user_id = getattr(user, "id", None)
    key_id = state.get("key_id")
    method = scope["method"]
    access.info(
        "%s %s %d %.1f ms%s",
        method,
        route,
        status,
        took * 1000,
        _who(user_id, key_id),
        extra={
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": round(took * 1000, 2),
            "user_id": user_id,
            "key_id": key_id,
        },
    )


def _who(user_id: int | None, key_id: int | None) -> str:
    """`` user:5``, `` user:5@key:2``, `` key:2`` or nothing, as order events name actors."""
    if user_id is None:
        return "" if key_id is None else f" key:{key_id}"
    return f" user:{user_id}" if key_id is None else f" user:{user_id}@key:{key_id}"
