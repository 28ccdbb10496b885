"""``Idempotency-Key`` on the POST routes that change something, as one decorator a route opts
into (placing keeps its own way, in its transaction: :mod:`dueflow.api.orders`)::

    keyed = idempotency.idempotent(deps)

    @routes.post("/{order_id}/cancel", response_model=OrderView, responses=errors(*MOVE))
    @keyed
    async def cancel(order_id: Id, request: Request) -> JSONResponse: ...

The decorator adds the optional header to the route and its two 409 codes to the route's error
answers (:data:`~dueflow.api.common.KEYED`; the OpenAPI document declares both) and, when a
request carries it, claims the key for the caller's request before the route runs
(:func:`dueflow.service.replays.claim`): the same key and request within 24 h answers the first
answer again, byte for byte (with ``Idempotent-Replayed: true``); the key with another request
(another route, path or body) is a 409 ``idempotency_key_reused``; a repeat while the first still
runs is a 409 ``idempotency_key_in_use``. A refused request keeps no key. The route may read its
claim (:func:`claimed`) to resume what an earlier run of the same request made.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Header, Request
from fastapi.responses import Response
from pydantic import BaseModel

from dueflow.api import auth
from dueflow.api.common import ADDED_CODES, KEYED, encode
from dueflow.exceptions import BackendError, InvalidInput
from dueflow.service import replays
from dueflow.service.deps import Deps

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
#: An Idempotency-Key: printable ASCII without spaces, as most clients make them (UUIDs).
PATTERN = re.compile(r"[!-~]{1,255}")
#: The header's parameter, as every keyed route declares it.
KeyHeader = Annotated[
    str | None,
    Header(
        alias=HEADER,
        description="1-255 printable ASCII characters, no spaces (a UUID): the same key from "
        "the same caller within 24 h answers the first answer again; with another request "
        "(route, path or body), 409 idempotency_key_reused; while the first is still running, "
        "409 idempotency_key_in_use.",
    ),
]
#: Set on an answer given again.
REPLAYED = "Idempotent-Replayed"

Endpoint = TypeVar("Endpoint", bound=Callable[..., Awaitable[Response]])


def checked(header: str) -> str:
    """The header's key, when well formed.

    Raises:
        InvalidInput: not 1-255 printable ASCII characters without spaces.
    """
    if not PATTERN.fullmatch(header):
        raise InvalidInput(f"{HEADER}: 1-255 printable ASCII characters, no spaces", field=HEADER)
    return header


def principal(request: Request) -> str:
    """Who a key belongs to: the user the request is for (``user:<id>``, whether they call
    with their token or a service key acts for them), else the service key acting for nobody
    (``key:<id>``, an admin key's own calls)."""
    if getattr(request.state, "user", None) is None:
        key_id = getattr(request.state, "key_id", None)
        if key_id is not None:
            return f"key:{key_id}"
    return replays.user(auth.caller(request).id)


def request_key(request: Request, key: str, arguments: Mapping[str, Any]) -> replays.Key:
    """The caller's ``key`` with the request it came with: the method, the route template and
    the hash of the path parameters (as the route parsed them) and the body's fields."""
    path = {name: arguments.get(name, raw) for name, raw in request.path_params.items()}
    bodies = [v.model_dump() for v in arguments.values() if isinstance(v, BaseModel)]
    digest = replays.request_hash({"path": path, "body": bodies[0] if bodies else None})
    route = getattr(request.scope.get("route"), "path", request.url.path)
    return replays.Key(principal(request), key, digest, method=request.method, route=route)


def again(replay: replays.Replay) -> Response:
    """The first answer, as it was sent."""
    assert replay.body is not None  # only placing's keys keep no answer
    return Response(
        replay.body,
        status_code=replay.status_code,
        media_type="application/json",
        headers={REPLAYED: "true"},
    )


def claimed(request: Request) -> replays.Claim | None:
    """The key this request claimed, if it came with one."""
    claim = getattr(request.state, "idempotency", None)
    return claim if isinstance(claim, replays.Claim) else None


def idempotent(deps: Deps, *, withheld: tuple[str, ...] = ()) -> Callable[[Endpoint], Endpoint]:
    """The decorator making a route take an ``Idempotency-Key`` (under the router's decorator,
    so the route registered is the keyed one). A request without the header costs nothing
    more; with it: a new key, a statement before the route and one after; a repeat, two.

    ``withheld``: fields of the answer kept as null for the repeats (a secret shown once, as
    a new key's or webhook endpoint's: it is never stored with the answer, so a repeat gets
    the first answer without it and the caller rotates if the first answer was lost)."""

    def decorate(endpoint: Endpoint) -> Endpoint:
        signature = inspect.signature(endpoint, eval_str=True)
        takes_request = "request" in signature.parameters
        parameters = [p for p in signature.parameters.values() if p.name != "request"]
        parameters.append(
            inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request)
        )
        parameters.append(
            inspect.Parameter(
                "idempotency_key",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=KeyHeader,
                default=None,
            )
        )

        @functools.wraps(endpoint)
        async def keyed(
            *, request: Request, idempotency_key: str | None = None, **arguments: Any
        ) -> Response:
            if takes_request:
                arguments["request"] = request
            if idempotency_key is None:
                return await endpoint(**arguments)
            key = request_key(request, checked(idempotency_key), arguments)
            got = await replays.claim(deps, key)
            if isinstance(got, replays.Replay):
                return again(got)
            request.state.idempotency = got
            try:
                response = await endpoint(**arguments)
            except Exception:
                await _release(deps, got)
                raise
            await _keep(deps, got, response, withheld)
            return response

        keyed.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        setattr(keyed, ADDED_CODES, KEYED)
        return keyed  # type: ignore[return-value]

    return decorate


async def _keep(
    deps: Deps, claim: replays.Claim, response: Response, withheld: tuple[str, ...]
) -> None:
    """Keep the answer for the repeats, without its ``withheld`` fields. The effect stands
    whatever happens here: a database that fails now leaves the claim to run out, and a repeat
    after it runs the route again (its state guard keeps one effect)."""
    body = bytes(response.body)
    if withheld:
        body = encode({**orjson.loads(body), **dict.fromkeys(withheld)})
    try:
        await replays.keep(deps, claim, response.status_code, body)
    except BackendError as exc:
        log.warning(
            "could not keep the answer of %s %s: %s", claim.key.method, claim.key.route, exc
        )


async def _release(deps: Deps, claim: replays.Claim) -> None:
    """Let the key go after a refusal; a database that fails now leaves the claim to run out."""
    try:
        await replays.release(deps, claim)
    except BackendError as exc:
        log.warning(
            "could not let go of a key of %s %s: %s", claim.key.method, claim.key.route, exc
        )
