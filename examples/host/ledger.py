"""The host's own database (SQLite): its users, its catalog, which of its users placed which
order, and the dueflow events it received. It holds nothing of an order's content: what an order
is (status, lines, amounts, payments) is read from the newest event's ``order`` snapshot."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS products (
    sku_id INTEGER PRIMARY KEY, title TEXT NOT NULL, price TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS placed (
    order_id INTEGER PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    checkout TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    order_id INTEGER,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_order ON events (order_id, seq);
"""

#: The host's own people: dueflow knows them only by these ids (``Dueflow-Act-As``).
USERS = [("ada", "Ada Lovelace"), ("ben", "Ben Okri")]


@dataclass(frozen=True)
class Product:
    """A thing the host sells: a dueflow SKU of the host's store."""

    sku_id: int
    title: str
    price: str


class Ledger:
    """The host's SQLite file. One connection on the event loop: each call is a few
    microseconds of local SQL, so a small app needs no thread or pool for it."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.executescript(SCHEMA)
        self.db.executemany("INSERT OR IGNORE INTO users (id, name) VALUES (?, ?)", USERS)

    def close(self) -> None:
        self.db.close()

    def users(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT id, name FROM users ORDER BY id").fetchall()

    def user(self, user_id: str | None) -> sqlite3.Row | None:
        return self.db.execute("SELECT id, name FROM users WHERE id = ?", (user_id,)).fetchone()

    def products(self) -> list[Product]:
        rows = self.db.execute("SELECT sku_id, title, price FROM products ORDER BY sku_id")
        return [Product(*row) for row in rows]

    def add_product(self, product: Product) -> None:
        self.db.execute(
            "INSERT INTO products (sku_id, title, price) VALUES (?, ?, ?)",
            (product.sku_id, product.title, product.price),
        )

    def record_placed(self, order_id: int, user_id: str, checkout: str) -> None:
        """Remember whose order it is (a repeat of the same checkout is the same order)."""
        self.db.execute(
            "INSERT OR IGNORE INTO placed (order_id, user_id, checkout) VALUES (?, ?, ?)",
            (order_id, user_id, checkout),
        )

    def orders_of(self, user_id: str) -> list[int]:
        rows = self.db.execute(
            "SELECT order_id FROM placed WHERE user_id = ? ORDER BY order_id DESC", (user_id,)
        )
        return [row[0] for row in rows]

    def owner(self, order_id: int) -> str | None:
        row = self.db.execute("SELECT user_id FROM placed WHERE order_id = ?", (order_id,))
        found = row.fetchone()
        return None if found is None else str(found[0])

    def record_event(self, event: dict[str, Any]) -> bool:
        """Keep a verified event once (dueflow may send one again: drop repeats by id); True
        when it was new."""
        order = event.get("order")
        kept = self.db.execute(
            "INSERT OR IGNORE INTO events (id, seq, order_id, body) VALUES (?, ?, ?, ?)",
            (event["id"], _seq(event["id"]), order and order["id"], json.dumps(event)),
        )
        return kept.rowcount == 1

    def events_of(self, order_id: int) -> list[dict[str, Any]]:
        """The order's events, oldest first (in dueflow's commit order, ``evt_<seq>``)."""
        rows = self.db.execute(
            "SELECT body FROM events WHERE order_id = ? ORDER BY seq", (order_id,)
        )
        return [json.loads(row[0]) for row in rows]


def _seq(event_id: str) -> int:
    """``evt_57`` -> 57: the event's place in dueflow's commit order."""
    return int(event_id.removeprefix("evt_"))
