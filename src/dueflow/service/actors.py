"""Who did it: the actor string every order event and key change records.

The grammar (``order_events.actor``, at most 64 characters): ``user:<id>`` for a user with a
personal token or an admin page session; ``user:<id>@key:<key id>`` for a user a service key acts
for (``Dueflow-Act-As``); ``key:<key id>`` for a service key on an admin route acting for nobody;
``operator``, ``cli``, ``timer``, ``close_or_query`` and a provider's name (``alipay``,
``wechatpay``, ``manual``) for the rest.

The key acting in the current request is kept in a context variable set by the API's
authentication (``api/auth.py``) for the request's duration: every use case that records
``user:<id>`` for its caller asks :func:`user` instead, so the events a key's request writes
name the key without every use case (placing in each flow, paying, cancelling, shipping, ...)
taking the key as one more argument.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ACTING_KEY: ContextVar[int | None] = ContextVar("dueflow_acting_key", default=None)


def user(user_id: int) -> str:
    """The actor of ``user_id`` acting in this request: ``user:<id>``, with ``@key:<key id>``
    when a service key acts for them."""
    key_id = _ACTING_KEY.get()
    return f"user:{user_id}" if key_id is None else f"user:{user_id}@key:{key_id}"


def key(key_id: int) -> str:
    """The actor of a service key acting for nobody (an admin route)."""
    return f"key:{key_id}"


@contextmanager
def acting_key(key_id: int | None) -> Iterator[None]:
    """Within the block, :func:`user` names ``key_id`` (None: no key acts)."""
    token = _ACTING_KEY.set(key_id)
    try:
        yield
    finally:
        _ACTING_KEY.reset(token)
