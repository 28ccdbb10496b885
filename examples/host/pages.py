"""The host's HTML pages: plain HTML, every value escaped."""

from __future__ import annotations

import sqlite3
import uuid
from html import escape
from typing import Any

from ledger import Product

#: Statuses an order leaves by itself (a payment, a deadline): its page reloads while in them.
MOVING = {"pending_payment", "pending_shipment", "shipped", "received"}


def page(title: str, body: str, *, refresh: bool = False) -> str:
    meta = '<meta http-equiv="refresh" content="2">' if refresh else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{meta}'
        f"<title>{escape(title)} · host shop</title></head>"
        f'<body><p><a href="/">host shop</a></p><h1>{escape(title)}</h1>{body}</body></html>'
    )


def picker(users: list[sqlite3.Row]) -> str:
    """Who are you? A user picker standing in for the host's real login."""
    buttons = "".join(
        f'<button name="user" value="{escape(u["id"])}">{escape(u["name"])}</button> '
        for u in users
    )
    return page("Who are you?", f'<form method="post" action="/login">{buttons}</form>')


def home(user: sqlite3.Row, products: list[Product], orders: list[dict[str, Any]]) -> str:
    """The catalog with a buy form per product (a fresh checkout id each: the order's
    Idempotency-Key, so a form sent twice places one order), and the user's orders."""
    rows = "".join(
        f'<li><form method="post" action="/orders">{escape(p.title)} ¥{escape(p.price)} '
        f'<input type="hidden" name="sku_id" value="{p.sku_id}">'
        f'<input type="hidden" name="checkout" value="{uuid.uuid4()}">'
        '<input name="quantity" value="1" size="2"> <button>Buy</button></form></li>'
        for p in products
    )
    mine = "".join(
        f'<li><a href="/orders/{o["id"]}">order {o["id"]}</a>: {escape(o["status"] or "placed")}'
        f" ¥{escape(o['amount'] or '')}</li>"
        for o in orders
    )
    body = (
        f"<p>Signed in as {escape(user['name'])} ({escape(user['id'])}).</p>"
        f"<h2>Buy</h2><ul>{rows}</ul><h2>Your orders</h2><ul>{mine or '<li>none yet</li>'}</ul>"
    )
    return page("Catalog", body)


def order(view: dict[str, Any]) -> str:
    """One order as its newest event shows it, and every event received for it."""
    snapshot = view["order"]
    if snapshot is None:
        body = "<p>Placed; waiting for dueflow's first event about it.</p>"
        return page(f"Order {view['id']}", body, refresh=True)
    lines = "".join(
        f"<tr><td>{escape(line['kind'])}</td><td>{escape(line['label'])}</td>"
        f"<td>{line['quantity']}</td><td>¥{escape(line['price'])}</td></tr>"
        for line in snapshot["lines"]
    )
    payments = "".join(
        f"<tr><td>{escape(p['pay_no'])}</td><td>{escape(p['provider'])}</td>"
        f"<td>¥{escape(p['amount'])}</td><td>{escape(p['state'])}</td></tr>"
        for p in snapshot["payments"]
    )
    events = "".join(
        f"<li>{escape(e['id'])} {escape(e['type'])} by {escape(_actor(e['actor']))}"
        f" at {escape(e['created_at'])}</li>"
        for e in view["events"]
    )
    pay = (
        f'<form method="post" action="/orders/{view["id"]}/pay"><button>Pay with WeChat Pay'
        "</button></form>"
        if snapshot["status"] == "pending_payment"
        else ""
    )
    body = (
        f'<p>Status <strong id="status">{escape(snapshot["status"])}</strong>, amount '
        f"¥{escape(snapshot['amount'])}, pay by {escape(snapshot['pay_deadline'] or '-')}</p>"
        f"{pay}<h2>Lines</h2><table>{lines}</table>"
        f"<h2>Payments</h2><table>{payments or '<tr><td>none</td></tr>'}</table>"
        f"<h2>Events received</h2><ol>{events}</ol>"
    )
    return page(f"Order {view['id']}", body, refresh=snapshot["status"] in MOVING)


def refused(message: str) -> str:
    """dueflow's error message (it says what went wrong: "sku 1 (mug): 1 left, 2 asked")."""
    return page("Not done", f"<p>{escape(message)}</p>")


def _actor(actor: dict[str, Any]) -> str:
    if actor["type"] == "user":
        via = f" through key {actor['key_id']}" if actor.get("key_id") else ""
        return f"user {actor['user_id']}{via}"
    if actor["type"] == "key":
        return f"key {actor['key_id']}"
    return f"{actor['type']} {actor.get('name', '')}".strip()
