"""The simulated Alipay OpenAPI gateway (``/alipay/gateway.do``) and its notification fields.

Like the real gateway it accepts GET and POST, merging query and form parameters (fzlee's SDK
sends everything in the query string, the official SDK puts ``biz_content`` in the form), checks
``app_id`` and the app's RSA2 signature (``sign_type`` signed), and always answers HTTP 200 with
``{"<method>_response": {...}, "sign": "..."}`` signed over the raw text of the response object
with Alipay's key. Business failures are ``code 40004`` with a ``sub_code`` and are signed too;
gateway-level failures (signature, app id, method) come as a signed ``error_response``.

QR trades: with ``alipay_trade_on_scan`` (the default), a precreated trade exists at Alipay only
once the buyer scans the code, as people report of the real service; until then query, close and
refund answer ``ACQ.TRADE_NOT_EXIST``, and an unscanned trade that expires leaves no trace.
``alipay.trade.cancel`` does reach an unscanned trade: it voids the code (scanning or paying it
later finds it closed), as Alipay's cancel closes any trade that has not been paid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dueflow.exceptions import MalformedNotification, NotificationRejected
from dueflow.payments import money_wire
from dueflow.payments.alipay import signing
from dueflow.payments.simulator import _alipay_fields as _fields
from dueflow.payments.simulator import control
from dueflow.payments.simulator._alipay_fields import Content
from dueflow.payments.simulator.state import (
    CST,
    OPERATIONS,
    FailMode,
    Notification,
    Provider,
    SimulatorState,
    Trade,
    TradeStatus,
)

ALIPAY = Provider.ALIPAY
SUCCESS = {"code": "10000", "msg": "Success"}
DEFAULT_EXPIRY = timedelta(hours=2)  # the longest a precreate QR code lives
SUBJECT_CHARS = 256  # the documented limit of a trade's subject
MEDIA_TYPE = "application/json;charset=utf-8"
_TIMEOUT_EXPRESS = re.compile(r"([1-9][0-9]*)([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True)
class Call:
    """One verified gateway call: the parsed ``biz_content``, all parameters, the request."""

    state: SimulatorState
    biz: Mapping[str, Any]
    params: Mapping[str, str]
    request: Request


def router(state: SimulatorState) -> APIRouter:
    """The ``/alipay`` routes over one simulator's state."""
    api = APIRouter()

    @api.api_route("/gateway.do", methods=["GET", "POST"])
    async def gateway(request: Request) -> Response:
        params = await _params(request)
        method = params.get("method", "")
        rejected = _check_request(state, params)
        if rejected is not None:
            return _signed(state, "error", rejected)
        biz = _biz_content(params)
        if biz is None:
            return _signed(
                state, method, _fields.failure("ACQ.INVALID_PARAMETER", "biz_content 无效")
            )
        state.advance()
        failure = state.take_failure(ALIPAY, OPERATIONS[ALIPAY][method])
        if failure is FailMode.SERVER_ERROR:
            return control.bad_gateway()
        if failure is FailMode.LOST:
            return await control.hang(state.config.hang_seconds)
        if failure is FailMode.SYSTEM_ERROR:
            return _signed(state, method, _fields.failure("ACQ.SYSTEM_ERROR", "系统错误"))
        content = METHODS[method](Call(state, biz, params, request))
        if failure is FailMode.TIMEOUT:
            return await control.hang(state.config.hang_seconds)
        return _signed(state, method, content)

    return api


def trade_status(trade: Trade) -> str:
    """The trade's status as Alipay spells it (a fully refunded trade is closed)."""
    if trade.status is TradeStatus.PAID:
        return "TRADE_CLOSED" if trade.fully_refunded else "TRADE_SUCCESS"
    return "WAIT_BUYER_PAY" if trade.status is TradeStatus.WAITING else "TRADE_CLOSED"


def notification_params(state: SimulatorState, notification: Notification) -> dict[str, str]:
    """The signed form parameters of one delivery attempt of an Alipay notification.

    ``notify_time`` is the time of the attempt; ``notify_id`` stays the same across retries.
    Empty values are left out, as Alipay does.
    """
    config, trade, refund = state.config, notification.trade, notification.refund
    params: dict[str, str] = {
        "notify_time": _fields.beijing_time(state.now()),
        "notify_type": "trade_status_sync",
        "notify_id": notification.notify_id,
        "app_id": config.alipay_app_id,
        "auth_app_id": config.alipay_app_id,
        "charset": "utf-8",
        "version": "1.0",
        "sign_type": signing.SIGN_TYPE,
        "trade_no": trade.trade_no,
        "out_trade_no": trade.out_trade_no,
        "seller_id": config.alipay_seller_id,
        "trade_status": notification.event,
        "total_amount": _fields.amount(trade.amount),
        "subject": trade.subject,
        "gmt_create": _fields.beijing_time(trade.created_at),
        **_fields.buyer(trade),
        **_fields.paid_fields(trade),
    }
    if trade.closed_at is not None:
        params["gmt_close"] = _fields.beijing_time(trade.closed_at)
    if refund is not None:
        params["out_biz_no"] = refund.out_refund_no
        params["refund_fee"] = _fields.amount(trade.refunded)
        params["gmt_refund"] = _fields.beijing_time(
            refund.succeeded_at or refund.created_at, millis=True
        )
    params = {key: value for key, value in params.items() if value}
    params["sign"] = signing.sign(params, config.alipay_key.private_key)
    return params


def _precreate(call: Call) -> Content:
    out_trade_no = _fields.text(call.biz, "out_trade_no")
    subject = _fields.text(call.biz, "subject")
    try:
        amount = money_wire.parse_alipay_amount(call.biz.get("total_amount"))
        expiry = _expiry(call.biz, call.state.now())
    except (MalformedNotification, ValueError) as exc:
        return _fields.failure("ACQ.INVALID_PARAMETER", f"参数无效: {exc}")
    if not out_trade_no or not subject:
        return _fields.failure("ACQ.INVALID_PARAMETER", "缺少 out_trade_no 或 subject")
    if len(subject) > SUBJECT_CHARS:
        return _fields.failure("ACQ.INVALID_PARAMETER", f"subject 长度超过 {SUBJECT_CHARS}")
    trade = call.state.trade(ALIPAY, out_trade_no)
    if trade is not None and trade.status is TradeStatus.PAID:
        return _fields.failure("ACQ.TRADE_HAS_SUCCESS", "交易已被支付")
    if trade is not None and trade.status is TradeStatus.CLOSED:
        return _fields.failure("ACQ.TRADE_HAS_CLOSE", "交易已经关闭")
    if trade is not None and trade.amount != amount:
        return _fields.failure("ACQ.INVALID_PARAMETER", "同一笔交易的金额不一致")
    if trade is None:
        trade = call.state.create_trade(
            ALIPAY,
            out_trade_no,
            amount=amount,
            subject=subject,
            notify_url=call.params.get("notify_url", ""),
            time_expire=expiry,
        )
    qr_code = control.pay_url(call.request, trade)
    return {**SUCCESS, "out_trade_no": out_trade_no, "qr_code": qr_code}


def _query(call: Call) -> Content:
    trade = _find(call)
    if trade is None:
        return _fields.not_exist()
    return {
        **SUCCESS,
        "trade_no": trade.trade_no,
        "out_trade_no": trade.out_trade_no,
        "trade_status": trade_status(trade),
        "total_amount": _fields.amount(trade.amount),
        **_fields.buyer(trade, query=True),
        **_fields.paid_fields(trade, query=True),
    }


def _close(call: Call) -> Content:
    trade = _find(call)
    if trade is None:
        return _fields.not_exist()
    if not call.state.close(trade):
        return _fields.failure("ACQ.TRADE_STATUS_ERROR", "交易状态不合法")
    return {**SUCCESS, "trade_no": trade.trade_no, "out_trade_no": trade.out_trade_no}


def _cancel(call: Call) -> Content:
    """``alipay.trade.cancel``: it reaches a QR trade nobody scanned (which close cannot), and
    names its ``trade_no`` and ``action`` only for a trade that exists."""
    out_trade_no = _fields.text(call.biz, "out_trade_no")
    trade = call.state.trade(ALIPAY, out_trade_no) if out_trade_no else _find(call)
    if trade is None:
        return _fields.not_exist()
    call.state.paid_on_close(trade)  # a payment armed to land just before this cancel
    existed = call.state.visible_trade(ALIPAY, trade.out_trade_no) is not None
    action = call.state.cancel(trade)
    content: Content = {**SUCCESS, "out_trade_no": trade.out_trade_no, "retry_flag": "N"}
    if existed:
        content["trade_no"] = trade.trade_no
        if action:
            content["action"] = action
    return content


def _refund(call: Call) -> Content:
    trade = _find(call)
    if trade is None:
        return _fields.not_exist()
    out_request_no = _fields.text(call.biz, "out_request_no") or trade.out_trade_no
    try:
        amount = money_wire.parse_alipay_amount(call.biz.get("refund_amount"))
    except MalformedNotification as exc:
        return _fields.failure("ACQ.INVALID_PARAMETER", f"refund_amount 无效: {exc.message}")
    refund = call.state.find_refund(ALIPAY, out_request_no, out_trade_no=trade.out_trade_no)
    repeated = refund is not None
    if refund is not None and refund.amount != amount:
        return _fields.failure("ACQ.INVALID_PARAMETER", "同一退款请求号的退款金额不一致")
    if refund is None:
        if trade_status(trade) != "TRADE_SUCCESS":
            return _fields.failure("ACQ.TRADE_STATUS_ERROR", "交易状态不合法")
        if amount > trade.amount - trade.refunded:
            return _fields.failure("ACQ.REFUND_AMT_NOT_EQUAL_TOTAL", "退款金额超限")
        reason = _fields.text(call.biz, "refund_reason")
        refund = call.state.refund(
            trade, out_request_no, amount=amount, reason=reason, notify_url=""
        )
    return {
        **SUCCESS,
        "trade_no": trade.trade_no,
        "out_trade_no": trade.out_trade_no,
        **_fields.buyer(trade, query=True),
        "fund_change": "N" if repeated else "Y",
        "refund_fee": _fields.amount(trade.refunded),
        "gmt_refund_pay": _fields.beijing_time(refund.created_at),
    }


def _refund_query(call: Call) -> Content:
    trade = _find(call)
    if trade is None:
        return _fields.not_exist()
    out_request_no = _fields.text(call.biz, "out_request_no") or trade.out_trade_no
    found = {"trade_no": trade.trade_no, "out_trade_no": trade.out_trade_no}
    refund = call.state.find_refund(ALIPAY, out_request_no, out_trade_no=trade.out_trade_no)
    if refund is None:  # no refund with that number: nothing to report, not an error
        return {**SUCCESS, **found}
    return {
        **SUCCESS,
        **found,
        "out_request_no": out_request_no,
        "total_amount": _fields.amount(trade.amount),
        "refund_amount": _fields.amount(refund.amount),
        "refund_status": "REFUND_SUCCESS",
        "gmt_refund_pay": _fields.beijing_time(refund.created_at),
    }


METHODS: dict[str, Callable[[Call], Content]] = {
    "alipay.trade.precreate": _precreate,
    "alipay.trade.query": _query,
    "alipay.trade.close": _close,
    "alipay.trade.cancel": _cancel,
    "alipay.trade.refund": _refund,
    "alipay.trade.fastpay.refund.query": _refund_query,
}


async def _params(request: Request) -> dict[str, str]:
    """Query and form parameters merged (the form wins), URL-decoded, first value of each."""
    params = dict(request.query_params)
    content_type = request.headers.get("content-type", "")
    if request.method == "POST" and content_type.startswith("application/x-www-form-urlencoded"):
        body = (await request.body()).decode("utf-8", errors="replace")
        for key, value in reversed(parse_qsl(body, keep_blank_values=True)):
            params[key] = value
    return params


def _check_request(state: SimulatorState, params: Mapping[str, str]) -> Content | None:
    """The gateway's error for a request it refuses, or None."""
    if not params.get("method"):
        return _fields.missing("isv.missing-method", "缺少方法名参数")
    if not params.get("app_id"):
        return _fields.missing("isv.missing-app-id", "缺少AppID参数")
    if params["app_id"] != state.config.alipay_app_id:
        return _fields.invalid("isv.invalid-app-id", "无效的AppID参数")
    if not params.get("sign"):
        return _fields.missing("isv.missing-signature", "缺少签名参数")
    if params.get("sign_type", signing.SIGN_TYPE) != signing.SIGN_TYPE:
        return _fields.invalid("isv.invalid-signature-type", "无效的签名类型")
    try:
        signing.verify_request(params, state.config.alipay_app_key.public_key)
    except NotificationRejected:
        return _fields.invalid("isv.invalid-signature", "验签出错")
    if params["method"] not in METHODS:
        return _fields.invalid("isv.invalid-method", "不存在的方法名")
    return None


def _biz_content(params: Mapping[str, str]) -> Mapping[str, Any] | None:
    try:
        biz = json.loads(params.get("biz_content") or "{}")
    except ValueError:
        return None
    return biz if isinstance(biz, dict) else None


def _signed(state: SimulatorState, method: str, content: Content) -> Response:
    """HTTP 200 with ``content`` under ``<method>_response``, signed with Alipay's key."""
    body = signing.build_response(method, content, state.config.alipay_key.private_key)
    return Response(body.encode("utf-8"), status_code=200, media_type=MEDIA_TYPE)


def _find(call: Call) -> Trade | None:
    """The trade named by ``trade_no`` (which wins) or ``out_trade_no``, if it exists."""
    trade_no = _fields.text(call.biz, "trade_no")
    if trade_no:
        matches = (t for t in call.state.trades.values() if t.trade_no == trade_no)
        trade = next(matches, None)
        return None if trade is None else call.state.visible_trade(ALIPAY, trade.out_trade_no)
    return call.state.visible_trade(ALIPAY, _fields.text(call.biz, "out_trade_no"))


def _expiry(biz: Mapping[str, Any], now: datetime) -> datetime:
    """``time_expire`` (Beijing time), else ``timeout_express`` (``90m``), else two hours."""
    time_expire = _fields.text(biz, "time_expire")
    if time_expire:
        expiry = datetime.strptime(time_expire, "%Y-%m-%d %H:%M:%S").replace(tzinfo=CST)
        if expiry <= now:
            raise ValueError(f"time_expire {time_expire} has passed")
        return expiry
    timeout = _fields.text(biz, "timeout_express")
    match = _TIMEOUT_EXPRESS.fullmatch(timeout)
    if timeout and match is None:
        raise ValueError(f"bad timeout_express {timeout!r}")
    if match is None:
        return now + DEFAULT_EXPIRY
    return now + timedelta(**{_UNITS[match[2]]: int(match[1])})
