"""The ASGI application (notify routes and health today)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from dueflow.api import notify
from dueflow.service.deps import Deps


def create_app(deps: Deps) -> FastAPI:
    """dueflow's HTTP app over already wired ``deps`` (the caller owns their lifetime)."""
    app = FastAPI(title="dueflow", version="0.1.0")
    app.include_router(notify.router(deps))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app
