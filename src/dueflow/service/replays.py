"""Idempotent placing: the first answer to a buyer's ``Idempotency-Key``, given again."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dueflow.exceptions import IdempotencyKeyReused
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.store import idempotency

#: A buyer's ``Idempotency-Key`` with the hash of its request, as placing ties it to the order.
Key = idempotency.Key


def key_for(
    buyer_id: int,
    key: str,
    request: Mapping[str, Any],
    answer: Callable[[Mapping[str, Any]], str] | None = None,
) -> Key:
    """The :data:`Key` of a placing request: ``request`` (its body as JSON values) hashed, so
    the same key with another body is told apart; ``answer`` writes the first answer kept."""
    digest = hashlib.sha256(
        json.dumps(request, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    return idempotency.Key(buyer_id, key, digest, answer=answer)


@dataclass(frozen=True)
class Replay:
    """What to answer a repeated request: the first answer as sent (``body``, kept with the key
    in the placing transaction), or, when the key kept no answer (its placer gave no
    :attr:`~dueflow.store.idempotency.Key.answer`), the order as it is now (``view``)."""

    status_code: int
    body: str | None = None
    view: dict[str, Any] | None = None


async def replay(deps: Deps, key: idempotency.Key) -> Replay | None:
    """The answer for a key already used by this buyer within 24 h, or None for a new key
    (one statement).

    Raises:
        IdempotencyKeyReused: the key came with another request.
    """
    now = deps.clock.now()
    async with deps.db.read() as conn:
        row = await idempotency.find(conn, key.buyer_id, key.key, now)
        if row is None:
            return None
        if row.request_hash != key.request_hash:
            raise IdempotencyKeyReused(
                "this Idempotency-Key was used for another request; use a new key"
            )
        if row.body is not None:
            return Replay(int(row.status_code), body=str(row.body))
        return Replay(201, view=await order_service.view_in(conn, int(row.order_id)))
