"""The ASGI application: the buyer, seller and admin API, the provider notify routes, health."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

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

    @app.middleware("http")
    async def timed(request: Request, call_next: Any) -> Any:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        deps.metrics.http_latency.labels(request.method, path, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        return response

    return app
