"""A faithful local Alipay and WeChat Pay v3, for tests, demos and development.

Production code talks to it through a base URL with the keys it hands out and cannot tell it
from the real providers: same endpoints, same signatures, same notification retries. A control
API steers it (pay, duplicate, delay or drop notifications, fail the next call, pay just as a
close arrives) and a plain pay page lets a person pay.

The modules: ``state`` (trades, refunds, the outbox), ``alipay`` and ``wechatpay`` (the
providers' APIs and notification formats), ``notifier`` (delivery and retries), ``control``
(the control API) and ``app`` (``create_app``, ``serve``, the pay page). This module holds the
configuration, which builds nothing until asked. Usage::

    from dueflow.payments import simulator
    from dueflow.payments.simulator import app as simulator_app

    config = simulator.SimulatorConfig.generate(clock=clock, time_scale=60)
    asgi = simulator_app.create_app(config)            # mountable at /sim
    client = config.client_config("http://127.0.0.1:8000/sim")
    await simulator_app.simulator_of(asgi).deliver_due()  # or let the lifespan run the notifier
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from dueflow.clock import Clock, SystemClock
from dueflow.payments.rsa import KeyPair, generate_keypair

__all__ = ["ClientConfig", "SimulatorConfig"]


@dataclass(frozen=True)
class ClientConfig:
    """Everything a dueflow client needs to talk to this simulator as if it were the providers."""

    alipay_gateway_url: str
    alipay_app_id: str
    alipay_seller_id: str
    alipay_app_private_key: str
    alipay_public_key: str
    wechatpay_base_url: str
    wechatpay_appid: str
    wechatpay_mchid: str
    wechatpay_merchant_serial: str
    wechatpay_merchant_private_key: str
    wechatpay_public_key_id: str
    wechatpay_public_key: str
    wechatpay_api_v3_key: str


@dataclass(frozen=True, kw_only=True)
class SimulatorConfig:
    """One simulator instance's identities, keys and behaviour.

    Attributes:
        alipay_app_key: The merchant app's key pair; the gateway verifies with its public half.
        alipay_key: Alipay's own key pair; it signs responses and notifications.
        wechat_merchant_key: The merchant API key pair; requests are verified with its public half.
        wechat_platform_key: WeChat Pay's key pair, named by ``wechat_public_key_id``.
        clock: The source of "now" (a ``FakeClock`` in tests).
        time_scale: Notification retry intervals are divided by this factor.
        transport: The httpx transport notifications are sent through (None: the network).
        alipay_trade_on_scan: Alipay QR trades exist only once the buyer scans (opens the pay
            page or pays); before that, query and close answer ``ACQ.TRADE_NOT_EXIST``.
        refund_settle_after: How long a WeChat refund stays ``PROCESSING``.
        hang_seconds: How long a ``timeout`` failure holds the answer before a bare 504.
    """

    alipay_app_id: str
    alipay_seller_id: str
    alipay_app_key: KeyPair
    alipay_key: KeyPair
    wechat_appid: str
    wechat_mchid: str
    wechat_merchant_serial: str
    wechat_merchant_key: KeyPair
    wechat_public_key_id: str
    wechat_platform_key: KeyPair
    wechat_api_v3_key: str
    clock: Clock = field(default_factory=SystemClock)
    time_scale: float = 1.0
    transport: httpx.AsyncBaseTransport | None = None
    alipay_trade_on_scan: bool = True
    refund_settle_after: timedelta = timedelta(seconds=5)
    hang_seconds: float = 30.0

    @classmethod
    def generate(cls, **options: Any) -> SimulatorConfig:
        """A configuration with fresh ids and four fresh RSA-2048 key pairs.

        Args:
            **options: Any of the behaviour fields (``clock``, ``time_scale``, ``transport``, ...).
        """
        mchid = f"19{secrets.randbelow(10**8):08d}"
        return cls(
            alipay_app_id=f"2021{secrets.randbelow(10**12):012d}",
            alipay_seller_id=f"2088{secrets.randbelow(10**12):012d}",
            alipay_app_key=generate_keypair(),
            alipay_key=generate_keypair(),
            wechat_appid="wx" + secrets.token_hex(8),
            wechat_mchid=mchid,
            wechat_merchant_serial=secrets.token_hex(20).upper(),
            wechat_merchant_key=generate_keypair(),
            wechat_public_key_id=f"PUB_KEY_ID_01{mchid}{secrets.randbelow(10**20):020d}",
            wechat_platform_key=generate_keypair(),
            wechat_api_v3_key=secrets.token_hex(16),
            **options,
        )

    def client_config(self, base_url: str) -> ClientConfig:
        """What a dueflow client needs, for the simulator served at ``base_url``.

        Args:
            base_url: Where the simulator app is reachable, e.g. ``http://127.0.0.1:8000/sim``.
        """
        base = base_url.rstrip("/")
        return ClientConfig(
            alipay_gateway_url=f"{base}/alipay/gateway.do",
            alipay_app_id=self.alipay_app_id,
            alipay_seller_id=self.alipay_seller_id,
            alipay_app_private_key=self.alipay_app_key.private_pem(),
            alipay_public_key=self.alipay_key.public_pem(),
            wechatpay_base_url=f"{base}/wechatpay",
            wechatpay_appid=self.wechat_appid,
            wechatpay_mchid=self.wechat_mchid,
            wechatpay_merchant_serial=self.wechat_merchant_serial,
            wechatpay_merchant_private_key=self.wechat_merchant_key.private_pem(),
            wechatpay_public_key_id=self.wechat_public_key_id,
            wechatpay_public_key=self.wechat_platform_key.public_pem(),
            wechatpay_api_v3_key=self.wechat_api_v3_key,
        )
