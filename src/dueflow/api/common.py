"""What every JSON route shares: request bodies that refuse what they do not name
(:class:`Body`), ids and limits checked at the edge (:data:`Id`, :data:`Limit`), and the answer
(:func:`answer`), and each resource's router (:func:`resource`).

Each route's ``response_model`` documents its answer in the OpenAPI schema; the JSON itself is
built by :func:`answer` (FastAPI passes a returned response through untouched), encoded once by
orjson: money stays exact decimal text and datetimes keep their ``+00:00``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from dueflow.api.schemas import errors

#: Ids are positive 64-bit integers; anything else is refused before it reaches the database.
MAX_ID = 2**63 - 1
Id = Annotated[int, Path(ge=1, le=MAX_ID)]
Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many rows")]


#: What :func:`~dueflow.api.auth.current_user` and ``current_admin`` may answer themselves.
GUARD_STATUSES = (400, 401, 403, 422)


def resource(
    prefix: str,
    guard: Callable[..., Any],
    statuses: Sequence[int],
    tag: str | None = None,
) -> APIRouter:
    """The router of a resource: its routes under ``prefix``, each behind ``guard`` (who may
    call: :func:`~dueflow.api.auth.current_user` with its scope, or ``current_admin``), documented with the
    error answers of ``statuses`` (:func:`~dueflow.api.schemas.errors`), grouped under ``tag``
    in the OpenAPI document."""
    return APIRouter(
        prefix=prefix,
        tags=[tag] if tag else None,
        dependencies=[Depends(guard)],
        # Every guarded route may refuse a key acting for nobody (400), a credential (401), a
        # scope (403) and a malformed Dueflow-Act-As (422).
        responses=errors(*sorted({*statuses, *GUARD_STATUSES})),
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
