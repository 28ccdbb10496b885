"""The provider notify routes: raw body kept (up to a limit), verified, applied, answered in each
provider's own terms only after the commit."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from dueflow import exceptions
from dueflow.api import errors
from dueflow.service import notifications
from dueflow.service.deps import Deps


def failure_status(receipt: notifications.Receipt) -> int:
    """The HTTP status of a notification not accepted (the provider retries on any of them):
    400 refused, 409 busy (the order stayed locked for the whole wait: a conflict to retry, as
    on the JSON API, not a crash), 500 when it could not be applied."""
    if receipt.outcome == "rejected":
        return 400
    if receipt.outcome == "busy":
        return errors.status_of(exceptions.Busy())
    return 500


async def limited_body(request: Request, limit: int = notifications.MAX_BODY) -> bytes:
    """The raw body, read no further than one byte past ``limit`` (an oversized body is then
    refused by the inbox without being held in memory whole)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)[: limit + 1]


def router(deps: Deps) -> APIRouter:
    """``POST /notify/alipay``, ``/notify/wechatpay`` and ``/notify/wechatpay/refund``."""
    routes = APIRouter(prefix="/notify", tags=["provider notifications"])

    @routes.post("/alipay", response_class=PlainTextResponse)
    async def alipay(request: Request) -> Response:
        receipt = await notifications.receive(
            deps, "alipay", await limited_body(request), dict(request.headers)
        )
        # Alipay retries unless the body is exactly "success".
        if receipt.accepted:
            return PlainTextResponse("success")
        return PlainTextResponse("fail", status_code=failure_status(receipt))

    async def wechat(request: Request) -> Response:
        receipt = await notifications.receive(
            deps, "wechatpay", await limited_body(request), dict(request.headers)
        )
        if receipt.accepted:
            return Response(status_code=204)
        return JSONResponse(
            {"code": "FAIL", "message": receipt.message or receipt.outcome},
            failure_status(receipt),
        )

    routes.add_api_route("/wechatpay", wechat, methods=["POST"])
    routes.add_api_route("/wechatpay/refund", wechat, methods=["POST"])
    return routes
