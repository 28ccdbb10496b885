"""What every JSON route shares: request bodies that refuse what they do not name
(:class:`Body`), ids and limits checked at the edge (:data:`Id`, :data:`Limit`), and the answer
(:func:`answer`), and each resource's router (:func:`resource`).

Each route's ``response_model`` documents its answer in the OpenAPI schema; the JSON itself is
built by :func:`answer` (FastAPI passes a returned response through untouched), encoded once by
orjson: money stays exact decimal text and datetimes keep their ``+00:00``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from dueflow.api.schemas import codes_in, errors, is_error
from dueflow.error_codes import ErrorCode

#: Ids are positive 64-bit integers; anything else is refused before it reaches the database.
MAX_ID = 2**63 - 1
Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many rows")]


#: What every /api route can answer (each is behind :mod:`~dueflow.api.auth`'s guard): no
#: valid credential (none, unknown, revoked, expired), a service key without the route's scope,
#: a personal token sending Dueflow-Act-As, a malformed Dueflow-Act-As (``field`` names the
#: header), a body over the limit, the database locked or unreachable, a bug. (Not per use case:
#: any request can meet them.)
EVERY_ROUTE = (
    ErrorCode.UNAUTHORIZED,
    ErrorCode.MISSING_SCOPE,
    ErrorCode.ACT_AS_NOT_ALLOWED,
    ErrorCode.INVALID_INPUT,
    ErrorCode.BODY_TOO_LARGE,
    ErrorCode.BUSY,
    ErrorCode.BACKEND_UNAVAILABLE,
    ErrorCode.INTERNAL_ERROR,
)
#: What a route for a user adds (behind :func:`~dueflow.api.auth.current_user`): a service key
#: acting for nobody.
FOR_A_USER = (ErrorCode.ACT_AS_REQUIRED,)
#: What a route with path or query parameters adds.
WITH_PARAMS = (ErrorCode.INVALID_INPUT,)
#: What a route with a JSON body adds: not JSON (or not even UTF-8 text: ``bad_request``), a
#: field invalid, and what the database can refuse of a write (a value it cannot hold, a
#: constraint).
WITH_BODY = (
    ErrorCode.MALFORMED_JSON,
    ErrorCode.BAD_REQUEST,
    ErrorCode.INVALID_INPUT,
    ErrorCode.UNSTORABLE_VALUE,
    ErrorCode.CONFLICT,
)

#: What a route taking an ``Idempotency-Key`` adds (:mod:`~dueflow.api.idempotency`'s decorator
#: declares them on each route it keys): the key used for another request, or its first request
#: still running.
KEYED = (ErrorCode.IDEMPOTENCY_KEY_REUSED, ErrorCode.IDEMPOTENCY_KEY_IN_USE)

#: The attribute of an endpoint naming codes a decorator adds to what the route declares.
ADDED_CODES = "error_codes"


class _Router(APIRouter):
    """A router whose routes' error answers hold the router's codes, their own and those a
    decorator of the endpoint added (:data:`ADDED_CODES`), status by status (FastAPI would let
    a route's answer of a status replace the router's); a route's other answers stay as they
    are."""

    def add_api_route(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        own = kwargs.pop("responses", None) or {}
        added = getattr(endpoint, ADDED_CODES, ())
        kwargs["responses"] = {
            **{status: meant for status, meant in own.items() if not is_error(meant)},
            **errors(*codes_in(self.responses), *codes_in(own), *added),
        }
        super().add_api_route(path, endpoint, **kwargs)


def resource(
    prefix: str,
    guard: Callable[..., Any],
    codes: Sequence[ErrorCode] = (),
    tag: str | None = None,
) -> APIRouter:
    """The router of a resource: its routes under ``prefix``, each behind ``guard`` (who may
    call: :func:`~dueflow.api.auth.current_user` with its scope, whose routers add
    :data:`FOR_A_USER` to ``codes``, or ``current_admin``), documented with the error answers of
    :data:`EVERY_ROUTE` and ``codes`` besides their own (:func:`~dueflow.api.schemas.errors`),
    grouped under ``tag`` in the OpenAPI document."""
    return _Router(
        prefix=prefix,
        tags=[tag] if tag else None,
        dependencies=[Depends(guard)],
        responses=errors(*EVERY_ROUTE, *codes),
    )


class Body(BaseModel):
    """A request body: unknown fields and loose types are refused (422)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _unnative(value: Any) -> Any:
    """What orjson does not encode itself: Decimals (as exact text), mappings that are not
    dicts (rows' mappings) and named tuples."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def encode(value: Any) -> bytes:
    """``value`` as JSON in one pass: Decimals as strings (money stays exact), datetimes as
    ISO 8601 (``+00:00``, microseconds when there are any), keys as text."""
    return orjson.dumps(value, default=_unnative, option=orjson.OPT_NON_STR_KEYS)


class _Encoded(JSONResponse):
    """A JSON response rendered by :func:`encode`."""

    def render(self, content: Any) -> bytes:
        return encode(content)


def answer(value: Any, status: int = 200) -> JSONResponse:
    """A JSON response of ``value``, encoded once (:func:`encode`)."""
    return _Encoded(value, status_code=status)


def every_route(app: Any) -> Iterator[Any]:
    """Every route of the FastAPI ``app`` as the router puts it in a request's scope, those of
    included routers too (FastAPI 0.16x keeps an included router whole, as
    ``original_router``, where older releases copy its routes into the app's)."""
    todo: list[Any] = list(app.router.routes)
    while todo:
        route = todo.pop()
        included = getattr(route, "original_router", None)
        if included is not None:
            todo += included.routes
        else:
            yield route
