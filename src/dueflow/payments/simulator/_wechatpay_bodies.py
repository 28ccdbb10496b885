"""The simulated WeChat Pay's bodies: the Transaction object (queries and payment
notifications), the Refund object (refund answers and queries), a refund notification's resource
and a notification's encrypted body, all with times in Beijing time.

Private to :mod:`dueflow.payments.simulator.wechatpay`, which re-exports the public ones.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from dueflow.domain import money
from dueflow.payments.simulator.state import (
    CST,
    Notification,
    Provider,
    Refund,
    RefundStatus,
    SimulatorState,
    Trade,
    TradeStatus,
)
from dueflow.payments.wechatpay import signing

WECHATPAY = Provider.WECHATPAY

Payload = dict[str, Any]


def trade_state(trade: Trade) -> tuple[str, str]:
    """The trade's ``trade_state`` and ``trade_state_desc``."""
    if trade.status is TradeStatus.PAID:
        return ("REFUND", "转入退款") if trade.refunded else ("SUCCESS", "支付成功")
    if trade.status is TradeStatus.WAITING:
        return "NOTPAY", "订单未支付"
    return "CLOSED", "订单已关闭"


def transaction(state: SimulatorState, trade: Trade) -> Payload:
    """The Transaction object that queries answer and payment notifications carry."""
    config = state.config
    code, desc = trade_state(trade)
    fen = money.to_fen(trade.amount)
    body: Payload = {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "out_trade_no": trade.out_trade_no,
        "trade_state": code,
        "trade_state_desc": desc,
        "attach": trade.attach,
        "amount": {"total": fen, "currency": "CNY", "payer_currency": "CNY"},
    }
    if trade.paid_at is not None:
        body.update(
            transaction_id=trade.trade_no,
            trade_type="NATIVE",
            bank_type="OTHERS",
            success_time=rfc3339(trade.paid_at),
            payer={"openid": trade.buyer_id},
        )
        body["amount"]["payer_total"] = fen
    return body


def notification_body(state: SimulatorState, notification: Notification) -> bytes:
    """The JSON body of a notification, its resource AES-256-GCM encrypted with the APIv3 key."""
    refund = notification.refund
    if refund is None:
        kind, summary, resource = "transaction", "支付成功", transaction(state, notification.trade)
    else:
        kind, summary = "refund", "退款成功"
        resource = refund_resource(state, notification.trade, refund)
    nonce = signing.new_nonce(12)
    plaintext = json.dumps(resource, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    body = {
        "id": notification.notify_id,
        "create_time": rfc3339(notification.created_at),
        "resource_type": "encrypt-resource",
        "event_type": notification.event,
        "summary": summary,
        "resource": {
            "original_type": kind,
            "algorithm": "AEAD_AES_256_GCM",
            "ciphertext": signing.encrypt_resource(
                state.config.wechat_api_v3_key, nonce, kind, plaintext
            ),
            "associated_data": kind,
            "nonce": nonce,
        },
    }
    return dumps(body)


def refund_body(state: SimulatorState, refund: Refund) -> Payload:
    trade = state.trades[WECHATPAY, refund.out_trade_no]
    total, refunded = money.to_fen(trade.amount), money.to_fen(refund.amount)
    body: Payload = {
        "refund_id": refund.refund_id,
        "out_refund_no": refund.out_refund_no,
        "transaction_id": trade.trade_no,
        "out_trade_no": trade.out_trade_no,
        "channel": "ORIGINAL",
        "user_received_account": "支付用户零钱",
        "create_time": rfc3339(refund.created_at),
        "status": "SUCCESS" if refund.status is RefundStatus.SUCCESS else "PROCESSING",
        "funds_account": "AVAILABLE",
        "amount": {
            "total": total,
            "refund": refunded,
            "payer_total": total,
            "payer_refund": refunded,
            "settlement_total": total,
            "settlement_refund": refunded,
            "discount_refund": 0,
            "currency": "CNY",
        },
    }
    if refund.succeeded_at is not None:
        body["success_time"] = rfc3339(refund.succeeded_at)
    return body


def refund_resource(state: SimulatorState, trade: Trade, refund: Refund) -> Payload:
    total, refunded = money.to_fen(trade.amount), money.to_fen(refund.amount)
    return {
        "mchid": state.config.wechat_mchid,
        "out_trade_no": trade.out_trade_no,
        "transaction_id": trade.trade_no,
        "out_refund_no": refund.out_refund_no,
        "refund_id": refund.refund_id,
        "refund_status": "SUCCESS",
        "success_time": rfc3339(refund.succeeded_at or refund.created_at),
        "user_received_account": "支付用户零钱",
        "amount": {
            "total": total,
            "refund": refunded,
            "payer_total": total,
            "payer_refund": refunded,
        },
    }


def dumps(payload: Payload) -> bytes:
    """Compact UTF-8 JSON, as WeChat Pay writes it."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def rfc3339(when: datetime) -> str:
    """RFC 3339 in Beijing time, to the second."""
    return when.astimezone(CST).isoformat(timespec="seconds")
