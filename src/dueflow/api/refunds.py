"""The operators' refund routes under ``/api/admin/refunds``: the queue, and what an operator
does to a refund (approve, retry, reject with a reason, record it settled off-line with a
reference). Every action is an order event whose actor is the calling admin."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from dueflow.api import auth, idempotency
from dueflow.api import schemas as out
from dueflow.api.common import WITH_BODY, WITH_PARAMS, Body, Id, Limit, answer, resource
from dueflow.api.lists import After
from dueflow.api.schemas import Money, RefundView, View, codes_in, errors
from dueflow.error_codes import ErrorCode
from dueflow.service import lists, refunds
from dueflow.service.deps import Deps


class Rejection(Body):
    """Why the refund is rejected: no money goes back."""

    reason: out.SingleLine = Field(
        min_length=1, max_length=refunds.NOTE_LENGTH, examples=["buyer kept the goods"]
    )


class OfflineSettlement(Body):
    """How the money went back outside dueflow: a bank transfer's number, say."""

    reference: out.SingleLine = Field(
        min_length=1, max_length=refunds.NOTE_LENGTH, examples=["ICBC transfer 20260301-0042"]
    )


class RefundListItem(RefundView):
    """A refund with its attempt's pay number and total."""

    pay_no: str
    total: Money


#: The header that names the refunds' next page (absent on the last).
NEXT_LINK = {
    "description": "the next page, when more follow: ``</api/admin/refunds?...&after=CURSOR>; "
    'rel="next"`` (RFC 8288)',
    "schema": {"type": "string"},
}


class RefundState(View):
    """A refund's state after an operator's action."""

    id: int
    state: str = Field(
        description="pending_review | processing | succeeded | failed | rejected | settled_offline"
    )


def router(deps: Deps) -> APIRouter:
    """The refund routes over ``deps``, for admins only."""
    api = resource(
        "/api/admin/refunds", auth.current_admin(deps), [ErrorCode.NOT_ALLOWED], tag="admin"
    )
    keyed = idempotency.idempotent(deps)

    def answered(refund_id: int, now: str) -> JSONResponse:
        return answer({"id": refund_id, "state": now})

    @api.get(
        "",
        response_model=list[RefundListItem],
        responses={**errors(*WITH_PARAMS), 200: {"headers": {"Link": NEXT_LINK}}},
        response_description="a page of refunds; the next page's address in the Link header",
    )
    async def list_refunds(
        request: Request,
        state: Annotated[str | None, Query(max_length=32)] = None,
        after: After = None,
        limit: Limit = 100,
    ) -> JSONResponse:
        """The refunds, newest first, optionally in one state, a page at a time. The body is
        the page's refunds (a list, as before it had pages); when more follow, the ``Link``
        header names the next page (``<...&after=CURSOR>; rel="next"``): the same request with
        ``after`` set to the cursor every other list answers as ``next``."""
        page = await lists.refunds_list(deps, state=state, after=after, limit=limit)
        sent = answer(page.items)
        if page.next is not None:
            following = request.url.include_query_params(after=page.next)
            sent.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
        return sent

    moved = errors(*WITH_PARAMS, ErrorCode.NOT_FOUND, ErrorCode.INVALID_TRANSITION)
    # Closing one asks the provider first whether it was paid back meanwhile.
    noted = errors(*codes_in(moved), *WITH_BODY, ErrorCode.PROVIDER_UNAVAILABLE)

    @api.post("/{refund_id}/approve", response_model=RefundState, responses=moved)
    @keyed
    async def approve(refund_id: Id, request: Request) -> JSONResponse:
        """Submit a refund in review to its provider."""
        return answered(
            refund_id, await refunds.approve(deps, refund_id, actor=auth.actor(request))
        )

    @api.post("/{refund_id}/retry", response_model=RefundState, responses=moved)
    @keyed
    async def retry(refund_id: Id, request: Request) -> JSONResponse:
        """Submit a failed refund again, with the same refund number."""
        return answered(refund_id, await refunds.retry(deps, refund_id, actor=auth.actor(request)))

    @api.post("/{refund_id}/reject", response_model=RefundState, responses=noted)
    @keyed
    async def reject(refund_id: Id, body: Rejection, request: Request) -> JSONResponse:
        """Reject a refund in review or failed, with a reason: no money goes back (final)."""
        done = await refunds.reject(deps, refund_id, reason=body.reason, actor=auth.actor(request))
        return answered(refund_id, done)

    @api.post("/{refund_id}/settle-offline", response_model=RefundState, responses=noted)
    @keyed
    async def settle_offline(
        refund_id: Id, body: OfflineSettlement, request: Request
    ) -> JSONResponse:
        """Record a refund in review or failed as paid back outside dueflow, with a reference
        such as a bank transfer's number (final)."""
        done = await refunds.settle_offline(
            deps, refund_id, reference=body.reference, actor=auth.actor(request)
        )
        return answered(refund_id, done)

    return api
