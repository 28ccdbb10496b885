"""A host shop with its own accounts that sells through dueflow.

Its users live in its own SQLite file (ledger.py); dueflow knows them only by the host's ids,
sent with a service key in ``Dueflow-Act-As``. It places orders (an ``Idempotency-Key`` per
checkout), sends the buyer to dueflow's payment simulator to pay, and learns everything else
from the events dueflow POSTs to ``/webhooks/dueflow``, verified with the Standard Webhooks
library: an order's page shows the newest event's ``order`` snapshot and never asks dueflow.

Run it: ``python app.py`` with the settings below in the environment (README.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx
import pages
import uvicorn
from ledger import Ledger, Product
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

log = logging.getLogger("host")

#: The host's store, the seller of its catalog: a dueflow user acted for like any other.
STORE = ("store", "Host shop")
#: What the store sells, put on sale in dueflow at the first start: title, price, stock.
CATALOG = [("green tea", "12.50", 100), ("tea mug", "25.00", 50)]


@dataclass(frozen=True)
class Settings:
    """From the environment: ``HOST_DUEFLOW_URL``, ``HOST_DUEFLOW_KEY`` (a service key with
    the orders, catalog and payments scopes), ``HOST_WEBHOOK_SECRET`` (the ``whsec_`` secret of
    the endpoint dueflow posts events to), ``HOST_DB`` and ``HOST_PORT``."""

    dueflow_url: str
    dueflow_key: str
    webhook_secret: str
    db: str
    port: int

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            dueflow_url=os.environ.get("HOST_DUEFLOW_URL", "http://127.0.0.1:8000"),
            dueflow_key=os.environ["HOST_DUEFLOW_KEY"],
            webhook_secret=os.environ["HOST_WEBHOOK_SECRET"],
            db=os.environ.get("HOST_DB", "host.db"),
            port=int(os.environ.get("HOST_PORT", "8001")),
        )


class Refused(Exception):
    """dueflow said no: its status and its error's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Dueflow:
    """dueflow's API, called with the host's service key, acting for one of the host's users."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def call(
        self,
        path: str,
        body: dict[str, Any],
        *,
        user: tuple[str, str],
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` acting for ``user`` (the host's id and display name)."""
        headers = {"Dueflow-Act-As": user[0], "Dueflow-Act-As-Name": user[1]}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        try:
            answer = await self.http.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise Refused(502, f"dueflow did not answer: {exc!r}") from exc
        if answer.is_error:
            try:
                message = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = answer.reason_phrase
            raise Refused(answer.status_code, message)
        result: dict[str, Any] = answer.json()
        return result


def create_app(settings: Settings) -> Starlette:
    verifier = Webhook(settings.webhook_secret)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ledger = Ledger(settings.db)
        auth = {"Authorization": f"Bearer {settings.dueflow_key}"}
        async with httpx.AsyncClient(
            base_url=settings.dueflow_url, headers=auth, timeout=10
        ) as http:
            app.state.ledger, app.state.dueflow = ledger, Dueflow(http)
            await _stock_the_store(ledger, app.state.dueflow)
            yield
        ledger.close()

    async def receive_event(request: Request) -> Response:
        """dueflow's events webhook: verified, kept once, answered 204 (any 2xx is a delivery;
        anything else is retried, so a forged or stale message is refused with 400)."""
        body = await request.body()
        try:
            event = verifier.verify(body, dict(request.headers))
        except WebhookVerificationError as exc:
            log.warning("refused a webhook message: %s", exc)
            return JSONResponse({"error": "signature not verified"}, status_code=400)
        request.app.state.ledger.record_event(event)
        return Response(status_code=204)

    routes = [
        Route("/", home),
        Route("/login", login, methods=["POST"]),
        Route("/orders", place, methods=["POST"]),
        Route("/orders/{order_id:int}", show_order),
        Route("/orders/{order_id:int}/pay", pay, methods=["POST"]),
        Route("/api/orders/{order_id:int}", order_json),
        Route("/webhooks/dueflow", receive_event, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={Refused: _refused})


async def _stock_the_store(ledger: Ledger, dueflow: Dueflow) -> None:
    """Put the catalog on sale in dueflow once (the host keeps the SKU ids it got)."""
    if ledger.products():
        return
    for title, price, stock in CATALOG:
        sku = await dueflow.call(
            "/api/skus", {"title": title, "price": price, "stock": stock}, user=STORE
        )
        ledger.add_product(Product(sku["id"], title, price))


async def home(request: Request) -> Response:
    ledger: Ledger = request.app.state.ledger
    user = ledger.user(request.cookies.get("user"))
    if user is None:
        return HTMLResponse(pages.picker(ledger.users()))
    orders = [_summary(_view(ledger, order_id)) for order_id in ledger.orders_of(user["id"])]
    return HTMLResponse(pages.home(user, ledger.products(), orders))


async def login(request: Request) -> Response:
    """The user picker's answer. A real host signs its users in; this one trusts the cookie."""
    chosen = (await _form(request)).get("user", "")
    response = RedirectResponse("/", status_code=303)
    if request.app.state.ledger.user(chosen) is not None:
        response.set_cookie("user", chosen, httponly=True, samesite="lax")
    return response


async def place(request: Request) -> Response:
    """Place an order for the signed-in user; the checkout id is the Idempotency-Key, so the
    same form sent again (a double click, a retry after a lost answer) is the same order."""
    ledger: Ledger = request.app.state.ledger
    user = ledger.user(request.cookies.get("user"))
    form = await _form(request)
    if user is None or not form.get("checkout"):
        return RedirectResponse("/", status_code=303)
    try:
        line = {"sku_id": int(form["sku_id"]), "quantity": int(form["quantity"])}
    except (KeyError, ValueError):
        return HTMLResponse(pages.page("Not done", "<p>Say which and how many.</p>"), 400)
    placed = await request.app.state.dueflow.call(
        "/api/orders",
        {"lines": [line]},
        user=(user["id"], user["name"]),
        idempotency_key=form["checkout"],
    )
    ledger.record_placed(placed["id"], user["id"], form["checkout"])
    return RedirectResponse(f"/orders/{placed['id']}", status_code=303)


async def pay(request: Request) -> Response:
    """Start a WeChat Pay payment for the user's order and send them to its pay page (here
    dueflow's simulator); the order's page shows it paid once the ``pay`` event arrives."""
    user, order_id = _own_order(request)
    if user is None:
        return Response("no such order", status_code=404)
    started = await request.app.state.dueflow.call(
        f"/api/orders/{order_id}/payments", {"provider": "wechatpay"}, user=user
    )
    return RedirectResponse(started["pay_url"], status_code=303)


async def show_order(request: Request) -> Response:
    user, order_id = _own_order(request)
    if user is None:
        return HTMLResponse(pages.page("Not found", "<p>No such order.</p>"), status_code=404)
    return HTMLResponse(pages.order(_view(request.app.state.ledger, order_id)))


async def order_json(request: Request) -> Response:
    """What the order's page shows, as JSON."""
    user, order_id = _own_order(request)
    if user is None:
        return JSONResponse({"error": "no such order"}, status_code=404)
    return JSONResponse(_view(request.app.state.ledger, order_id))


def _own_order(request: Request) -> tuple[tuple[str, str] | None, int]:
    """The signed-in user (id, name) if the order in the path is theirs, and its id."""
    ledger: Ledger = request.app.state.ledger
    order_id: int = request.path_params["order_id"]
    user = ledger.user(request.cookies.get("user"))
    if user is None or ledger.owner(order_id) != user["id"]:
        return None, order_id
    return (user["id"], user["name"]), order_id


def _view(ledger: Ledger, order_id: int) -> dict[str, Any]:
    """The order from its events alone: the newest event's snapshot, and the events."""
    events = ledger.events_of(order_id)
    snapshots = [e["order"] for e in events if e["order"] is not None]
    return {"id": order_id, "order": snapshots[-1] if snapshots else None, "events": events}


def _summary(view: dict[str, Any]) -> dict[str, Any]:
    order = view["order"] or {}
    return {"id": view["id"], "status": order.get("status"), "amount": order.get("amount")}


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each), without python-multipart."""
    fields = parse_qs((await request.body()).decode())
    return {name: values[0] for name, values in fields.items()}


async def _refused(request: Request, exc: Refused) -> Response:
    status = exc.status if 400 <= exc.status < 500 else 502
    return HTMLResponse(pages.refused(exc.message), status_code=status)


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    settings = Settings.from_env()
    uvicorn.run(create_app(settings), host="127.0.0.1", port=settings.port)


if __name__ == "__main__":
    main()
