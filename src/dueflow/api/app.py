"""The ASGI application: the buyer, seller and admin API, the provider notify routes, health."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueflow import tracing
from dueflow.api import (
    admin,
    admin_pages,
    errors,
    events,
    goods,
    keys,
    lists,
    notify,
    orders,
    refunds,
    shop,
    shows,
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

    app.add_middleware(_Timed, deps=deps)
    _add_links(app)
    return app


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


class _Timed:
    """Every HTTP request's latency by method, route and status, as plain ASGI: a
    ``BaseHTTPMiddleware`` would start a task group for every request and every body read."""

    def __init__(self, app: ASGIApp, deps: Deps) -> None:
        self.app = app
        self.deps = deps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless the app starts an answer of its own

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            # The router writes the matched route into the scope it was given.
            path = getattr(scope.get("route"), "path", "unmatched")
            self.deps.metrics.http_latency.labels(scope["method"], path, str(status)).observe(
                time.perf_counter() - started
            )
