"""The simulated WeChat Pay API v3 (under ``/wechatpay``) and its notification bodies.

Every request must carry a merchant ``Authorization`` header signed over
``METHOD\\nPATH?QUERY\\ntimestamp\\nnonce\\nbody\\n`` with the merchant key, within 5 minutes of
the simulator's clock (401 ``SIGN_ERROR`` otherwise). The path signed is the one starting at
``/v3/``, as on the real host, wherever the simulator is mounted. Every answer, a 204 included,
carries the five ``Wechatpay-*`` headers signed with the platform key named by the
``PUB_KEY_ID_...`` serial; bodies are ``application/json; charset=utf-8`` and errors are
``{"code", "message"}``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dueflow.domain import money
from dueflow.exceptions import InvalidInput, NotificationRejected
from dueflow.payments.simulator import control
from dueflow.payments.simulator._wechatpay_bodies import (
    Payload,
    dumps,
    notification_body,
    refund_body,
    trade_state,
    transaction,
)
from dueflow.payments.simulator.state import (
    FailMode,
    Provider,
    SimulatorState,
    Trade,
    TradeStatus,
)
from dueflow.payments.wechatpay import signing

__all__ = [
    "Call",
    "Payload",
    "notification_body",
    "platform_headers",
    "router",
    "trade_state",
    "transaction",
]

log = logging.getLogger(__name__)
WECHATPAY = Provider.WECHATPAY
JSON_TYPE = "application/json; charset=utf-8"
DEFAULT_EXPIRY = timedelta(hours=2)  # how long a native code_url lives
DESCRIPTION_BYTES = 127  # the documented limit of a native order's description, in UTF-8
MAX_FEN = 2**31 - 1  # every amount field is an int32 of fen

Reply = tuple[int, Payload | None]


@dataclass(frozen=True)
class Call:
    """One authenticated API call: its JSON body (POST), path and query parameters."""

    state: SimulatorState
    body: Mapping[str, Any]
    path: Mapping[str, str]
    query: Mapping[str, str]
    request: Request


Handler = Callable[[Call], Reply]


def router(state: SimulatorState) -> APIRouter:
    """The ``/wechatpay`` routes over one simulator's state."""
    api = APIRouter()
    routes: list[tuple[str, str, str, Handler]] = [
        ("POST", "/v3/pay/transactions/native", "native", _native),
        ("GET", "/v3/pay/transactions/out-trade-no/{out_trade_no}", "query", _query),
        ("POST", "/v3/pay/transactions/out-trade-no/{out_trade_no}/close", "close", _close),
        ("POST", "/v3/refund/domestic/refunds", "refund", _refund),
        ("GET", "/v3/refund/domestic/refunds/{out_refund_no}", "refund_query", _refund_query),
    ]
    for method, path, operation, handler in routes:
        api.add_api_route(path, _endpoint(state, operation, handler), methods=[method])
    return api


def platform_headers(state: SimulatorState, body: bytes) -> dict[str, str]:
    """The five signed ``Wechatpay-*`` headers for a body, stamped with the simulator's time."""
    config = state.config
    return signing.signed_headers(
        body,
        serial=config.wechat_public_key_id,
        private_key=config.wechat_platform_key.private_key,
        timestamp=int(state.now().timestamp()),
        nonce=signing.new_nonce(),
    )


def _native(call: Call) -> Reply:
    config, body = call.state.config, call.body
    out_trade_no, notify_url = _text(body, "out_trade_no"), _text(body, "notify_url")
    if body.get("appid") != config.wechat_appid or body.get("mchid") != config.wechat_mchid:
        return _error(400, "APPID_MCHID_NOT_MATCH", "appid和mch_id不匹配")
    try:
        amount = _total(body.get("amount"))
        expiry = _expiry(_text(body, "time_expire"), call.state.now())
    except (InvalidInput, ValueError) as exc:
        return _error(400, "PARAM_ERROR", f"参数错误: {exc}")
    if not out_trade_no or not notify_url or not _text(body, "description"):
        return _error(400, "PARAM_ERROR", "缺少 out_trade_no、description 或 notify_url")
    if len(_text(body, "description").encode("utf-8")) > DESCRIPTION_BYTES:
        return _error(400, "PARAM_ERROR", f"description 长度超过 {DESCRIPTION_BYTES} 字节")
    trade = call.state.trade(WECHATPAY, out_trade_no)
    if trade is None:
        trade = call.state.create_trade(
            WECHATPAY,
            out_trade_no,
            amount=amount,
            subject=_text(body, "description"),
            notify_url=notify_url,
            time_expire=expiry,
            attach=_text(body, "attach"),
        )
    elif trade.status is TradeStatus.PAID:
        return _error(403, "ORDERPAID", "该订单已支付")
    elif trade.status is TradeStatus.CLOSED:
        return _error(400, "ORDER_CLOSED", "订单已关闭")
    elif trade.amount != amount:
        return _error(403, "OUT_TRADE_NO_USED", "商户订单号重复")
    return 200, {"code_url": control.pay_url(call.request, trade)}


def _query(call: Call) -> Reply:
    trade = _path_trade(call, call.query.get("mchid"))
    if not isinstance(trade, Trade):
        return trade
    return 200, transaction(call.state, trade)


def _close(call: Call) -> Reply:
    trade = _path_trade(call, call.body.get("mchid"))
    if not isinstance(trade, Trade):
        return trade
    if call.state.close(trade):
        return 204, None
    if trade.status is TradeStatus.PAID:
        return _error(403, "ORDERPAID", "该订单已支付")
    return _error(400, "ORDER_CLOSED", "订单已关闭")


def _refund(call: Call) -> Reply:
    body = call.body
    out_refund_no = _text(body, "out_refund_no")
    if not out_refund_no or not isinstance(body.get("amount"), dict):
        return _error(400, "PARAM_ERROR", "缺少 out_refund_no 或 amount")
    trade = _refunded_trade(call)
    if trade is None:
        return _error(404, "RESOURCE_NOT_EXISTS", "订单不存在")
    amount = body["amount"]
    try:
        refund_amount, total = _fen(amount.get("refund")), _fen(amount.get("total"))
    except InvalidInput as exc:
        return _error(400, "PARAM_ERROR", f"amount 无效: {exc.message}")
    if total != trade.amount:
        return _error(400, "PARAM_ERROR", "订单金额与原订单不符")
    refund = call.state.find_refund(WECHATPAY, out_refund_no)
    if refund is not None:  # the same out_refund_no refunds once: answer the refund again
        if refund.out_trade_no != trade.out_trade_no or refund.amount != refund_amount:
            return _error(400, "INVALID_REQUEST", "退款单号已用于其他退款")
        return 200, refund_body(call.state, refund)
    if trade.status is not TradeStatus.PAID:
        return _error(400, "INVALID_REQUEST", "订单未支付")
    if refund_amount > trade.amount - trade.refunded:
        return _error(400, "INVALID_REQUEST", "申请退款金额超过订单可退金额")
    refund = call.state.refund(
        trade,
        out_refund_no,
        amount=refund_amount,
        reason=_text(body, "reason"),
        notify_url=_text(body, "notify_url"),
    )
    return 200, refund_body(call.state, refund)


def _refund_query(call: Call) -> Reply:
    refund = call.state.find_refund(WECHATPAY, call.path["out_refund_no"])
    if refund is None:
        return _error(404, "RESOURCE_NOT_EXISTS", "退款单不存在")
    return 200, refund_body(call.state, refund)


def _endpoint(
    state: SimulatorState, operation: str, handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        raw = await request.body()
        rejected = _authenticate(state, request, raw)
        if rejected is not None:
            return _respond(state, rejected)
        body = _json_body(raw) if request.method == "POST" else {}
        if body is None:
            return _respond(state, _error(400, "PARAM_ERROR", "请求体不是 JSON 对象"))
        state.advance()
        failure = state.take_failure(WECHATPAY, operation)
        if failure is FailMode.SERVER_ERROR:
            return control.bad_gateway()
        if failure is FailMode.LOST:
            return await control.hang(state.config.hang_seconds)
        if failure is FailMode.SYSTEM_ERROR:
            return _respond(state, _error(500, "SYSTEM_ERROR", "系统错误"))
        call = Call(state, body, request.path_params, request.query_params, request)
        reply = handler(call)
        if failure is FailMode.TIMEOUT:
            return await control.hang(state.config.hang_seconds)
        return _respond(state, reply)

    return endpoint


def _authenticate(state: SimulatorState, request: Request, body: bytes) -> Reply | None:
    """401 ``SIGN_ERROR`` unless the merchant signed this request, recently, as itself."""
    config = state.config
    try:
        auth = signing.verify_authorization(
            request.headers.get("authorization", ""),
            method=request.method,
            url=_signed_url(request),
            body=body,
            public_key=config.wechat_merchant_key.public_key,
            now=state.now(),
        )
    except NotificationRejected as exc:
        return _error(401, "SIGN_ERROR", f"签名错误: {exc.message}")
    if auth.mchid != config.wechat_mchid or auth.serial_no != config.wechat_merchant_serial:
        return _error(401, "SIGN_ERROR", "商户号或证书序列号不符")
    return None


def _signed_url(request: Request) -> str:
    """The path from ``/v3/`` on, as sent (still percent-encoded), with the raw query."""
    raw = request.scope.get("raw_path") or request.url.path.encode("utf-8")
    path = bytes(raw).decode("latin-1")
    path = path[path.find("/v3/") :] if "/v3/" in path else path
    query = bytes(request.scope.get("query_string", b"")).decode("latin-1")
    return f"{path}?{query}" if query else path


def _respond(state: SimulatorState, reply: Reply) -> Response:
    status, payload = reply
    if status >= 400 and payload is not None:
        log.warning(
            "wechatpay answers %d %s: %s", status, payload.get("code"), payload.get("message")
        )
    body = b"" if payload is None else dumps(payload)
    headers = platform_headers(state, body)
    headers["Request-ID"] = uuid.uuid4().hex
    if payload is not None:
        headers["Content-Type"] = JSON_TYPE
    return Response(body, status_code=status, headers=headers)


def _path_trade(call: Call, mchid: object) -> Trade | Reply:
    """The trade the path names, for the ``mchid`` the request names (the query's or the
    body's); else the error to answer (another merchant, no such trade)."""
    if mchid != call.state.config.wechat_mchid:
        return _error(400, "PARAM_ERROR", "mchid 与请求商户不符")
    trade = call.state.trade(WECHATPAY, call.path["out_trade_no"])
    if trade is None:
        return _error(404, "ORDER_NOT_EXIST", "订单不存在")
    return trade


def _refunded_trade(call: Call) -> Trade | None:
    transaction_id = _text(call.body, "transaction_id")
    if transaction_id:
        trades = call.state.trades.values()
        return next((t for t in trades if t.trade_no == transaction_id), None)
    return call.state.trade(WECHATPAY, _text(call.body, "out_trade_no"))


def _json_body(raw: bytes) -> Mapping[str, Any] | None:
    try:
        body = json.loads(raw or b"{}")
    except (UnicodeDecodeError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _total(amount: object) -> Decimal:
    if not isinstance(amount, dict) or amount.get("currency", "CNY") != "CNY":
        raise InvalidInput("amount must be {total, currency: CNY}")
    return _fen(amount.get("total"))


def _fen(value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"not an amount in fen: {value!r}")
    if not 0 < value <= MAX_FEN:  # checked first: a huge value overflows the decimal context
        raise InvalidInput(f"an amount in fen is 1 to {MAX_FEN}")
    return money.from_fen(value)


def _expiry(text: str, now: datetime) -> datetime:
    """``time_expire`` (RFC 3339 with an offset), or two hours from now."""
    if not text:
        return now + DEFAULT_EXPIRY
    expiry = datetime.fromisoformat(text)
    if expiry.tzinfo is None:
        raise ValueError(f"time_expire {text!r} has no UTC offset")
    if expiry <= now:
        raise ValueError(f"time_expire {text} has passed")
    return expiry


def _error(status: int, code: str, message: str) -> Reply:
    return status, {"code": code, "message": message}


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    return value if isinstance(value, str) else ""
