"""The ASGI application: the buyer, seller and admin API, the provider notify routes, health."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from dueflow.api import errors, notify, routes
from dueflow.service.deps import Deps


def create_app(deps: Deps) -> FastAPI:
    """dueflow's HTTP app over already wired ``deps`` (the caller owns their lifetime)."""
    app = FastAPI(title="dueflow", version="0.1.0")
    errors.install(app)
    app.include_router(routes.router(deps))
    app.include_router(notify.router(deps))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app
