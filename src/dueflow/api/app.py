"""The ASGI application: the buyer, seller and admin API, the provider notify routes, health."""

from __future__ import annotations

import time
from datetime import timedelta

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueflow.api import (
    admin_pages,
    admin_shop,
    admin_shows,
    errors,
    events,
    lists,
    notify,
    refunds,
    routes,
    shop,
    shows,
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
    app = FastAPI(title="dueflow", version="0.1.0")
    errors.install(app)
    app.include_router(routes.router(deps))
    app.include_router(lists.router(deps))
    app.include_router(refunds.router(deps))
    app.include_router(shows.router(deps))
    app.include_router(shop.router(deps))
    app.include_router(events.router(deps))
    app.include_router(notify.router(deps))
    app.include_router(
        admin_pages.router(
            deps,
            secret=session_secret.encode() if session_secret else None,
            ttl=session_ttl,
            secure=secure_cookies,
            sections=[admin_shows.add_routes, admin_shop.add_routes],
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
    return app


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
