"""The operators' web pages under ``/admin``: server-rendered (Jinja2), a signed cookie session
opened with an admin token, a CSRF token in every form.

Pages refresh their ``<main>`` every few seconds with a small script of our own
(``static/admin.js``); everything works without it, through plain links and forms that answer
with a redirect (post, redirect, get). Actions report back through a one-shot flash cookie.

One module per area, each adding its pages with ``add_routes(routes, pages)``: ``session``
(static files, login, logout), ``dashboard``, ``orders`` (the list, its CSV, one order), ``refunds`` (the queue and its
actions), ``timers``, ``events`` (the webhook's replay and skip), ``webhooks`` (the webhook
endpoints and their actions), ``shows``, ``gate`` (a show's door, for its organizer too),
``shop``, ``keys`` (service keys) and ``users``;
``site`` holds what they share (:class:`~dueflow.api.admin_pages.site.Pages`). The templates
and static files are in ``api/templates`` and ``api/static``.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from fastapi import APIRouter

from dueflow.api.admin_pages import (
    dashboard,
    events,
    gate,
    keys,
    orders,
    refunds,
    session,
    shop,
    shows,
    timers,
    users,
    webhooks,
)
from dueflow.api.admin_pages.site import Pages
from dueflow.service.deps import Deps

#: Each area's routes, in the order they are added.
AREAS = (
    session.add_routes,
    dashboard.add_routes,
    orders.add_routes,
    refunds.add_routes,
    timers.add_routes,
    events.add_routes,
    webhooks.add_routes,
    shows.add_routes,
    gate.add_routes,
    shop.add_routes,
    keys.add_routes,
    users.add_routes,
)


def router(
    deps: Deps,
    *,
    secret: bytes | None = None,
    ttl: timedelta | None = None,
    secure: bool = False,
) -> APIRouter:
    """The ``/admin`` pages and their static files over ``deps``, sessions signed with
    ``secret`` (a random one when None) and lasting ``ttl`` (12 hours when None)."""
    pages = Pages(
        deps,
        secret=secret or secrets.token_bytes(32),
        ttl=ttl or timedelta(hours=12),
        secure=secure,
    )
    routes = APIRouter(prefix="/admin", include_in_schema=False)
    for add_routes in AREAS:
        add_routes(routes, pages)
    return routes
