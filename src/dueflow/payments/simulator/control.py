"""The control API (JSON under ``/control``) that tests and people use to steer the simulator.

* ``POST /control/pay {"provider", "out_trade_no", "duplicate": n, "delay": s, "drop": bool}``:
  the buyer pays; ``duplicate`` is how many copies of the notification are sent (same notify id),
  ``delay`` holds the first attempt for that many seconds of simulator time, ``drop`` never
  sends it.
* ``POST /control/scan {"provider", "out_trade_no"}``: the buyer scans the code (an Alipay QR
  trade exists at the provider only from then on).
* ``POST /control/fail-next {"provider", "method", "mode"}``: the next call of that operation
  fails: ``SYSTEM_ERROR`` (the provider's signed system error, nothing done), ``5xx`` (a bare
  502 from a proxy, nothing done), ``timeout`` (the call takes effect, then the answer is
  held for ``hang_seconds`` and ends as a bare 504) or ``lost`` (nothing done, and the client
  sees what ``timeout`` shows: it cannot tell whether the call took effect).
* ``POST /control/pay-on-close {"provider", "out_trade_no"}``: the buyer pays just as the next
  close request that reaches that trade arrives, so the close loses (an Alipay code nobody
  scanned: the ``alipay.trade.cancel`` that voids it, which then refunds the payment).
* ``POST /control/deliver``: send the notifications that are due now.
* ``GET /control/state``: trades, refunds and notifications with their attempts.
* ``GET /control/keys``: what a dueflow client needs (:class:`dueflow.payments.simulator.ClientConfig`).

Errors are ``{"error": {"code", "message"}}`` with 404 (unknown trade), 409 (wrong state) or
400 (unknown operation).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from dueflow.exceptions import InvalidTransition
from dueflow.payments.simulator.state import (
    FailMode,
    Notification,
    Provider,
    SimulatorState,
    Trade,
    operation_name,
)

BAD_GATEWAY_PAGE = (
    "<html><head><title>502 Bad Gateway</title></head><body>502 Bad Gateway</body></html>"
)


class TradeRef(BaseModel):
    """Names one trade."""

    provider: Provider
    out_trade_no: str = Field(min_length=1)


class PayCommand(TradeRef):
    """Pay a trade, with optional notification faults."""

    duplicate: int = Field(default=1, ge=1, le=100)
    delay: float = Field(default=0.0, ge=0)
    drop: bool = False


class FailNextCommand(BaseModel):
    """Fail the next call of one operation."""

    provider: Provider
    method: str = Field(min_length=1)
    mode: FailMode


def bad_gateway() -> Response:
    """What a proxy in front of the provider answers when the provider is down."""
    return Response(BAD_GATEWAY_PAGE, status_code=502, media_type="text/html")


async def hang(seconds: float) -> Response:
    """Hold the answer past any sensible client timeout, then give up with a bare 504."""
    await asyncio.sleep(seconds)
    return Response(b"", status_code=504)


def mount_url(request: Request) -> str:
    """Where the simulator app is mounted, as the client reached it (``http://host/sim``)."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return str(request.url.replace(path=root or "/", query="")).rstrip("/")


def pay_url(request: Request, trade: Trade) -> str:
    """The pay page of a trade: Alipay's ``qr_code`` and WeChat's ``code_url`` point here."""
    return f"{mount_url(request)}/pay/{trade.provider}/{trade.out_trade_no}"


def router(state: SimulatorState, deliver_due: Callable[[], Awaitable[int]]) -> APIRouter:
    """The ``/control`` routes over one simulator's state.

    Args:
        state: The simulator's state.
        deliver_due: Sends the notifications that are due; returns how many it sent.
    """
    api = APIRouter()

    @api.post("/pay")
    async def pay(command: PayCommand) -> Response:
        trade = state.trade(command.provider, command.out_trade_no)
        if trade is None:
            return _unknown(command)
        try:
            sent = state.pay(
                trade, copies=command.duplicate, delay=command.delay, drop=command.drop
            )
        except InvalidTransition as exc:
            return _error(409, "wrong_state", exc.message)
        return JSONResponse({"trade": _trade(trade), "notifications": [n.seq for n in sent]})

    @api.post("/scan")
    async def scan(command: TradeRef) -> Response:
        trade = state.trade(command.provider, command.out_trade_no)
        if trade is None:
            return _unknown(command)
        state.scan(trade)
        return JSONResponse({"trade": _trade(trade)})

    @api.post("/fail-next")
    async def fail_next(command: FailNextCommand) -> Response:
        operation = operation_name(command.provider, command.method)
        if operation is None:
            return _error(400, "unknown_method", f"{command.provider} has no {command.method!r}")
        state.arm_failure(command.provider, operation, command.mode)
        return JSONResponse(
            {"provider": command.provider, "method": operation, "mode": command.mode}
        )

    @api.post("/pay-on-close")
    async def pay_on_close(command: TradeRef) -> Response:
        trade = state.trade(command.provider, command.out_trade_no)
        if trade is None:
            return _unknown(command)
        state.arm_pay_on_close(trade)
        return JSONResponse({"trade": _trade(trade), "pay_on_close": True})

    @api.post("/deliver")
    async def deliver() -> Response:
        return JSONResponse({"sent": await deliver_due()})

    @api.get("/state")
    async def snapshot() -> Response:
        state.advance()
        return JSONResponse(
            {
                "now": state.now().isoformat(),
                "trades": [_trade(t) for t in state.trades.values()],
                "refunds": [_jsonable(dataclasses.asdict(r)) for r in state.refunds.values()],
                "notifications": [_notification(n) for n in state.outbox],
            }
        )

    @api.get("/keys")
    async def keys(request: Request) -> Response:
        client = state.config.client_config(mount_url(request))
        return JSONResponse(dataclasses.asdict(client))

    return api


def _trade(trade: Trade) -> dict[str, Any]:
    fields: dict[str, Any] = _jsonable(dataclasses.asdict(trade))
    return fields


def _notification(notification: Notification) -> dict[str, Any]:
    fields = dataclasses.asdict(notification)
    for bulky in ("trade", "refund", "body"):
        fields.pop(bulky)
    fields["out_trade_no"] = notification.trade.out_trade_no
    if notification.refund is not None:
        fields["out_refund_no"] = notification.refund.out_refund_no
    jsonable: dict[str, Any] = _jsonable(fields)
    return jsonable


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Decimal):
        return str(value)
    return value


def _unknown(command: TradeRef) -> Response:
    return _error(404, "not_found", f"no {command.provider} trade {command.out_trade_no!r}")


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
