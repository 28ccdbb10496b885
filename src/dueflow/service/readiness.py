"""Whether this process can serve: what ``/readyz`` answers (``/healthz`` only says it runs).

Serving needs the database to answer, its schema at the revision this code needs, and the
trigger's backend (Redis, RabbitMQ) to answer. Each check is bounded, so a backend that hangs
makes the answer "not ready", not no answer at all.
"""

from __future__ import annotations

import asyncio
import logging

from dueflow import logs
from dueflow.service.deps import Deps
from dueflow.store import migrate

log = logging.getLogger(__name__)

#: How long one check may take before its part counts as not ready.
CHECK_SECONDS = 3.0


async def not_ready(deps: Deps) -> dict[str, str]:
    """What is not ready, by part (``database``, ``schema``, ``trigger``); empty when all is.

    The reasons are for anyone who can reach the endpoint: they say what is wrong, never a
    driver's text (that is logged).
    """
    problems: dict[str, str] = {}
    try:
        found = await asyncio.wait_for(migrate.revisions(deps.db), CHECK_SECONDS)
    except Exception as exc:  # whatever fails the check (a bug too) makes "not ready", not a 500
        logs.throttled(log, logging.WARNING, "database", "not ready: the database: %r", exc)
        problems["database"] = "the database does not answer"
    else:
        behind = migrate.behind(found)
        if behind is not None:
            problems["schema"] = f"{behind}: run `dueflow migrate`"
    try:
        await asyncio.wait_for(deps.trigger.ping(), CHECK_SECONDS)
    except Exception as exc:
        logs.throttled(
            log,
            logging.WARNING,
            "trigger",
            "not ready: the %s trigger: %r",
            deps.trigger.scheme,
            exc,
        )
        problems["trigger"] = f"the {deps.trigger.scheme} trigger's backend does not answer"
    return problems
