"""The simulator as one ASGI app: the providers' APIs, the control API and the pay pages.

Routes, relative to wherever the app is mounted (``/sim`` in dueflow's dev server)::

    /alipay/gateway.do                  Alipay OpenAPI (GET and POST)
    /wechatpay/v3/...                   WeChat Pay API v3
    /control/...                        the control API (see ``control.py``)
    /pay/{provider}/{out_trade_no}      the pay page (GET shows it, POST pays)

Served on its own (:func:`serve`, or ``uvicorn`` with ``create_app``), the app's lifespan runs
the notifier in the background. Mounted inside another app, whose lifespan Starlette does not
pass on to mounted apps, the host enters ``simulator_of(app).running()`` in its own lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import AsyncIterator

import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse

from dueflow.exceptions import InvalidTransition
from dueflow.payments.simulator import SimulatorConfig, alipay, control, wechatpay
from dueflow.payments.simulator.notifier import Notifier
from dueflow.payments.simulator.state import Provider, SimulatorState, Trade, TradeStatus

PROVIDER_NAMES = {Provider.ALIPAY: "支付宝 Alipay", Provider.WECHATPAY: "微信支付 WeChat Pay"}


class Simulator:
    """One simulator instance: its state and its notifier."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.state = SimulatorState(config)
        self.notifier = Notifier(self.state)

    async def deliver_due(self) -> int:
        """Send the notifications that are due now; returns how many attempts were made."""
        return await self.notifier.deliver_due()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Simulator]:
        """Run the notifier in the background for as long as the context lasts."""
        task = asyncio.create_task(self.notifier.run(), name="payment-simulator-notifier")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def create_app(config: SimulatorConfig) -> FastAPI:
    """A new simulator app with its own state (nothing is shared between apps).

    Args:
        config: Keys, ids and behaviour, e.g. ``SimulatorConfig.generate(clock=FakeClock())``.

    Returns:
        The ASGI app; ``simulator_of(app)`` reaches its state and notifier.
    """
    simulator = Simulator(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with simulator.running():
            yield

    app = FastAPI(
        title="dueflow payment simulator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.simulator = simulator
    app.include_router(alipay.router(simulator.state), prefix="/alipay")
    app.include_router(wechatpay.router(simulator.state), prefix="/wechatpay")
    app.include_router(control.router(simulator.state, simulator.deliver_due), prefix="/control")
    app.include_router(_pay_pages(simulator.state), prefix="/pay")
    return app


def simulator_of(app: FastAPI) -> Simulator:
    """The simulator behind an app made by :func:`create_app`."""
    simulator = app.state.simulator
    if not isinstance(simulator, Simulator):
        raise TypeError("not a payment simulator app")
    return simulator


async def serve(config: SimulatorConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve a simulator with uvicorn until the process is interrupted.

    Args:
        config: The simulator's configuration.
        host: The interface to listen on.
        port: The TCP port.
    """
    server_config = uvicorn.Config(create_app(config), host=host, port=port, lifespan="on")
    await uvicorn.Server(server_config).serve()


def _pay_pages(state: SimulatorState) -> APIRouter:
    """The plain HTML pay page a person opens from the QR code link."""
    pages = APIRouter()

    @pages.get("/{provider}/{out_trade_no}", response_class=HTMLResponse)
    async def show(provider: str, out_trade_no: str) -> HTMLResponse:
        trade = _page_trade(state, provider, out_trade_no)
        if trade is None:
            return _page("Unknown trade", "<p>No such trade.</p>", status=404)
        state.scan(trade)  # opening the page is scanning the code
        return _page("Pay", _trade_html(trade, payable=True))

    @pages.post("/{provider}/{out_trade_no}", response_class=HTMLResponse)
    async def pay(provider: str, out_trade_no: str) -> HTMLResponse:
        trade = _page_trade(state, provider, out_trade_no)
        if trade is None:
            return _page("Unknown trade", "<p>No such trade.</p>", status=404)
        try:
            state.pay(trade)
        except InvalidTransition:
            return _page("Not paid", _trade_html(trade, payable=False), status=409)
        return _page("Paid", _trade_html(trade, payable=False))

    return pages


def _page_trade(state: SimulatorState, provider: str, out_trade_no: str) -> Trade | None:
    if provider not in {p.value for p in Provider}:
        return None
    state.advance()
    return state.trade(Provider(provider), out_trade_no)


def _trade_html(trade: Trade, *, payable: bool) -> str:
    rows = (
        f"<p>{html.escape(PROVIDER_NAMES[trade.provider])}</p>"
        f"<p>{html.escape(trade.subject)}</p>"
        f"<p>Order <code>{html.escape(trade.out_trade_no)}</code></p>"
        f'<p class="amount">¥{trade.amount}</p>'
        f'<p class="status">{trade.status}</p>'
    )
    button = '<form method="post"><button type="submit">Pay</button></form>'
    return rows + (button if payable and trade.status is TradeStatus.WAITING else "")


def _page(title: str, body: str, *, status: int = 200) -> HTMLResponse:
    text = (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)} · payment simulator</title></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return HTMLResponse(text, status_code=status)
