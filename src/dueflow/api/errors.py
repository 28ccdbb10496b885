"""The one place where errors become HTTP answers: ``{"error": {"code", "message", "field"}}``.

Every :class:`~dueflow.exceptions.DueflowError` is answered with its code and the status the
code has in :mod:`dueflow.error_codes`; FastAPI's validation errors become 422 ``invalid_input``
naming the field (400 ``malformed_json`` for a body that is not JSON at all), and so does an
:class:`~dueflow.exceptions.InvalidInput` that names one (:func:`located`); Starlette's own HTTP
errors keep their status in the same shape (:data:`~dueflow.error_codes.FOR_HTTP_STATUS`), and a
body over :data:`MAX_BODY` bytes is refused with 413 before it is read whole.

What went wrong inside a backend is the operators' business, not the client's: a backend that
cannot be reached (and any other 5xx of ours) is answered with its class's generic message (an
unreachable database's names the database), the detail (a driver's or a client library's text)
goes to the log only, a line a second at most for one kind of trouble (:func:`public_message`).
An exception nobody expected is a 500 ``internal_error`` in the same shape.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueflow import exceptions as errors
from dueflow import logs
from dueflow.api.schemas import ErrorBody, ErrorDetail
from dueflow.error_codes import FOR_HTTP_STATUS, ErrorCode

log = logging.getLogger(__name__)

#: The largest request body the JSON API accepts.
MAX_BODY = 64 * 1024

#: An order's own routes: "not yours" there is answered as "no such order" (nothing leaks).
ORDER_PATH = re.compile(r"^/api/orders/(?P<order_id>[^/]+)")


def error_body(code: ErrorCode, message: str, field: str | None = None) -> dict[str, Any]:
    """The error JSON, as :class:`~dueflow.api.schemas.ErrorBody` documents it."""
    return ErrorBody(error=ErrorDetail(code=code, message=message, field=field)).model_dump()


def status_of(exc: errors.DueflowError) -> int:
    """The HTTP status for ``exc``: its code's (:mod:`dueflow.error_codes`); 500 for a code no
    HTTP answer carries."""
    return exc.code.status or 500


def field_path(loc: Sequence[int | str]) -> str:
    """A validation error's location as ``error.field`` names it: ``body.lines[0].quantity``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def located(request: Request, field: str) -> str:
    """A field a use case named (``lines[0].quantity``, ``after``, ``Dueflow-Act-As``) with
    where the route takes it: ``path.``, ``query.`` or ``header.`` when it or one of its
    dependencies (the router's guard) has such a parameter, else ``body.`` when it has a body."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return field
    name = re.split(r"[.\[]", field, maxsplit=1)[0]
    for where, alias in _parameters(route.dependant):
        if alias == name:
            return f"{where}.{field}"
    return f"body.{field}" if route.body_field is not None else field


def _parameters(found: Dependant) -> Iterator[tuple[str, str]]:
    """Where each parameter of ``found`` and of its dependencies is taken, and its name."""
    for where, params in (
        ("path", found.path_params),
        ("query", found.query_params),
        ("header", found.header_params),
    ):
        yield from ((where, p.alias) for p in params)
    for dependency in found.dependencies:
        yield from _parameters(dependency)


def public_message(exc: errors.DueflowError) -> str:
    """What a client is told of ``exc``: its message, except for a 5xx of ours (a backend that
    cannot be reached, a bug), whose detail may be a driver's text: then its class's generic
    message. A provider's own refusal (502/503) is the provider's answer and is told."""
    if status_of(exc) < 500 or isinstance(exc, errors.ProviderError):
        return exc.message
    return (type(exc).__doc__ or "").strip() or "internal error"


def _hides_order(request: Request, exc: errors.DueflowError) -> re.Match[str] | None:
    """Someone else's order looks exactly like a missing one, except to an admin. The order's
    own buyer or seller asking for the other party's action already knows the order: they are
    told the role it needs (403 ``not_your_role``)."""
    if not isinstance(exc, errors.NotAllowed) or isinstance(exc, errors.NotYourRole):
        return None
    user = getattr(request.state, "user", None)
    if user is not None and user.is_admin:
        return None
    return ORDER_PATH.match(request.url.path)


async def dueflow_error(request: Request, exc: Exception) -> JSONResponse:
    """A DueflowError as its status and the error JSON."""
    assert isinstance(exc, errors.DueflowError)
    hidden = _hides_order(request, exc)
    if hidden is not None:
        missing = errors.NotFound(f"no order {hidden['order_id']}")
        return JSONResponse(error_body(missing.code, missing.message), status_of(missing))
    status = status_of(exc)
    message = public_message(exc)
    if message != exc.message:
        # An outage fails request after request alike: a line a second says so.
        logs.throttled(
            log,
            logging.WARNING,
            f"{status} {exc.message}",
            "%s %s answered %d: %s",
            request.method,
            request.url.path,
            status,
            exc.message,
        )
    field = getattr(exc, "field", None)
    located_field = located(request, field) if field else None
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(exc.code, message, located_field), status, headers=headers)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything else as a 500 in the error JSON; the exception is logged with the request's id
    once this answer is sent (by the outermost middleware, ``api/app.py``)."""
    code = ErrorCode.INTERNAL_ERROR
    return JSONResponse(error_body(code, "internal error"), code.status or 500)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 naming each bad field in the message and the first in ``field``; 400 when the body
    is not JSON at all."""
    assert isinstance(exc, RequestValidationError)
    problems = exc.errors()
    if any(p.get("type") == "json_invalid" for p in problems):
        bad = ErrorCode.MALFORMED_JSON
        return JSONResponse(error_body(bad, "the body is not valid JSON"), bad.status or 400)
    paths = [field_path(p.get("loc", ())) for p in problems]
    message = "; ".join(
        f"{path}: {p.get('msg', 'invalid')}" for path, p in zip(paths, problems, strict=True)
    )
    code = errors.InvalidInput.code
    field = paths[0] if paths and paths[0] else None
    return JSONResponse(error_body(code, message or "invalid input", field), code.status or 422)


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (404 route, 405, 401 from auth, 413) in the same shape."""
    assert isinstance(exc, HTTPException)
    code = FOR_HTTP_STATUS.get(exc.status_code, ErrorCode.HTTP_ERROR)
    return JSONResponse(
        error_body(code, str(exc.detail)), exc.status_code, headers=dict(exc.headers or {})
    )


class BodyLimit:
    """Refuse an /api or /admin request body over ``limit`` bytes: at once when Content-Length
    says so, otherwise as soon as the streamed body grows past it. (The notify routes keep
    their own limit: an oversized notification is still kept in the inbox, truncated.)"""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not path.startswith(("/api", "/admin")):
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited, send)

    def _message(self) -> str:
        return f"the body is over {self.limit // 1024} KiB"

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(ErrorCode.BODY_TOO_LARGE, self._message())).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def install(app: FastAPI, *, max_body: int = MAX_BODY) -> None:
    """Map dueflow's errors, validation errors and HTTP errors to the error JSON, and limit
    /api and /admin request bodies to ``max_body`` bytes."""
    app.add_exception_handler(errors.DueflowError, dueflow_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    app.add_middleware(BodyLimit, limit=max_body)
