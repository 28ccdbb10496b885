"""``POST /api/orders`` for goods, served without FastAPI's request machinery.

The route in :mod:`dueflow.api.orders` stays the one truth of what placing answers and of the
OpenAPI document. This plain ASGI layer, between the app's outer middleware
(:class:`~dueflow.api.app`'s ``_Timed``: request id, latency, access log) and FastAPI's stack,
takes the one request shape that is nearly all of a marketplace's placing traffic: a buyer's
personal token, ``Content-Type: application/json``, a body of exactly ``{"goods_id": N}``, no
``Idempotency-Key``, no ``Dueflow-Act-As``, tracing off. Such a request is placed on one
connection (:func:`dueflow.service.orders.place_by_token`: the token's read is the placing
transaction's first statement) and answered the bytes the route answers: the order's view
(201), or the same error JSON from the same handlers (:mod:`dueflow.api.errors`).

Every other request to the route (a service key, a keyed or traced request, any other body, a
body over the limit or without a length) goes to FastAPI as it came, its body handed on
unread: it meets the route's own validation, dependencies and answers. Nothing is written
before that choice is made.

What the layer skips, measured (docs/benchmarks.md, "Place order at the reference's speed"):
routing, dependency solving, the body model's validation, Starlette's exception middleware and
a second connection checkout and transaction (the token's read).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueflow import tracing
from dueflow.api import common, errors
from dueflow.api.orders import for_parties
from dueflow.exceptions import DueflowError
from dueflow.service import keys, orders
from dueflow.service.accounts import User
from dueflow.service.deps import Deps

log = logging.getLogger(__name__)

PATH = "/api/orders"
#: Headers that send a request the route's own way (FastAPI): each changes what placing does.
_ELSEWHERE = frozenset({b"idempotency-key", b"dueflow-act-as", b"dueflow-act-as-name"})
_JSON = b"application/json"
_CREATED_HEADERS = ((b"content-type", _JSON),)


class HotPlace:
    """The ASGI layer taking the plain place of goods off ``app`` (FastAPI's stack)."""

    def __init__(self, app: ASGIApp, deps: Deps, route: APIRoute) -> None:
        self.app = app
        self.deps = deps
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] != "POST"
            or tracing.on()
        ):
            await self.app(scope, receive, send)
            return
        token = _plain_request(scope["headers"])
        if token is None:
            await self.app(scope, receive, send)
            return
        body = await _whole_body(receive)
        if body is None:
            return  # the client went away: nobody to answer, nothing done
        goods_id = _goods_id(body)
        if goods_id is None:
            await self.app(scope, _replay(body, receive), send)
            return
        await self._place(scope, receive, send, token, goods_id)

    async def _place(
        self, scope: Scope, receive: Receive, send: Send, token: str, goods_id: int
    ) -> None:
        # What the route's guard leaves for the access log, the metrics and the error handlers.
        scope["route"] = self.route
        state = scope.setdefault("state", {})
        state["key_id"] = None

        def known(user: User) -> None:
            state["user"] = user

        try:
            view = await orders.place_by_token(
                self.deps, token=token, goods_id=goods_id, known=known
            )
        except DueflowError as error:
            answer = await errors.dueflow_error(Request(scope, receive), error)
            await answer(scope, receive, send)
            return
        except Exception:
            # As Starlette's outermost middleware does: the 500 in the error JSON, then raised
            # on (the app's outer layer logs it once, with the request id).
            answer = await errors.unexpected_error(Request(scope, receive), Exception())
            await answer(scope, receive, send)
            raise
        await _send_json(send, 201, common.encode(for_parties(view)))


def _plain_request(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The personal token of a request the layer takes (see the module's docstring), else
    None."""
    token = None
    length = typed = False
    for name, value in headers:
        if name in _ELSEWHERE:
            return None
        if name == b"authorization":
            if token is not None:
                return None
            scheme, _, param = value.decode("latin-1").partition(" ")
            token = param.strip()
            if scheme.lower() != "bearer" or not token or keys.is_key(token):
                return None
        elif name == b"content-type":
            if typed or value != _JSON:
                return None
            typed = True
        elif name == b"content-length":
            if length or not value.isdigit() or int(value) > errors.MAX_BODY:
                return None
            length = True
    return token if length and typed else None


async def _whole_body(receive: Receive) -> bytes | None:
    """The request's body, or None when the client went away before sending it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _goods_id(body: bytes) -> int | None:
    """N of a body that is exactly ``{"goods_id": N}`` with N a valid id, else None."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(parsed) is not dict or len(parsed) != 1:
        return None
    goods_id = parsed.get("goods_id")
    if type(goods_id) is not int or not 1 <= goods_id <= common.MAX_ID:
        return None
    return goods_id


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed out first."""
    pending = True

    async def again() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _send_json(send: Send, status: int, body: bytes) -> None:
    """A JSON answer with the headers Starlette's JSONResponse gives."""
    headers: Any = [(b"content-length", str(len(body)).encode()), *_CREATED_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
