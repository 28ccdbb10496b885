"""A lean reference for place order: what ``POST /api/orders`` costs without the framework.

A bare ASGI app under uvicorn with uvloop and httptools, on the driver alone: stdlib ``sqlite3``
(one connection, autocommit off by hand, ``BEGIN IMMEDIATE``), an ``asyncpg`` pool or an
``asyncmy`` pool. It places an order for ``{"goods_id": N}`` from a bearer token by running the
statements of :data:`PLACE` in one transaction, in order, and answers the new order with orjson.
The statements are dueflow's own place (``benchmarks/http_place.py --show-statements`` prints
what dueflow sends today), written plainly: when dueflow's place changes, change the table; the
benchmark prints both counts side by side. It writes the rows dueflow writes (the order, its
line, the goods held, the ``cancel_unpaid`` and ``pay_reminder`` timers, the ``place`` event),
so the same database checks hold after a run. No worker, no timers fire, nothing else.

    .venv/bin/python benchmarks/reference_server.py --database-url sqlite:///x.db --port 8100
    .venv/bin/python benchmarks/reference_server.py --database-url postgresql://postgres@127.0.0.1/bench \\
        --workers 2

``GET /healthz`` answers ok; ``GET /metrics`` gives ``reference_db_statements_total`` (the
statements of :data:`PLACE` run, BEGIN and COMMIT not counted) in the text format.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sqlite3
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import uvicorn

#: The prod profile's windows for a ``normal`` order: pay within 30 minutes, reminded at 5.
PAY = timedelta(minutes=30)
REMINDER = timedelta(minutes=5)
#: Connections a PostgreSQL or MySQL process keeps, as dueflow's SQLAlchemy pool (5 + 10).
POOL = 15
ENV_URL = "REFERENCE_DATABASE_URL"


class Refusal(Exception):
    """The answer instead of a 201: an HTTP status and dueflow's error code."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status = status
        self.code = code


#: Refusals as (status, code): each raise makes a fresh Refusal of one.
UNAUTHORIZED = (401, "unauthorized")
NO_GOODS = (404, "not_found")
UNAVAILABLE = (409, "goods_unavailable")


def goods_refusal(values: dict[str, Any]) -> tuple[int, str] | None:
    """dueflow's checks on the goods read: not your own, on sale, held by nobody."""
    if values["seller_id"] == values["buyer_id"]:
        return (403, "not_allowed")
    if values["goods_status"] != "on_sale" or values["reserved_order_id"] is not None:
        return UNAVAILABLE
    return None


@dataclass(frozen=True)
class Step:
    """One statement of the place. Its ``:names`` are taken from what the request and the
    steps before it found: a SELECT's first row adds its columns (by their names), an INSERT
    with ``key`` adds the new row's id under that name. ``missing``: the refusal when a SELECT
    finds no row or an UPDATE changes none; ``check``: a refusal decided on what was read."""

    name: str
    sql: str
    missing: tuple[int, str] | None = None
    key: str | None = None
    check: Callable[[dict[str, Any]], tuple[int, str] | None] | None = None


_ORDER_COLUMNS = (
    "flow, order_type, buyer_id, seller_id, goods_id, amount, status, created_at, "
    "pay_deadline, updated_at"
)
_TIMER_COLUMNS = "order_id, kind, deadline_at, due_at, state, attempts, stuck, created_at"

#: dueflow's place order, statement by statement (as of this commit: the token lookup, then the
#: place transaction; the 201's view is built from what it wrote). Keep it in step with what
#: ``http_place.py --show-statements`` prints for dueflow.
PLACE: tuple[Step, ...] = (
    Step(
        "user by token",
        "SELECT id AS buyer_id, is_admin FROM users WHERE token_hash = :token_hash",
        missing=UNAUTHORIZED,
    ),
    Step(
        "goods",
        "SELECT seller_id, title, price, status AS goods_status, reserved_order_id "
        "FROM goods WHERE id = :goods_id",
        missing=NO_GOODS,
        check=goods_refusal,
    ),
    Step(
        "order",
        f"INSERT INTO orders ({_ORDER_COLUMNS}) VALUES ('marketplace', 'normal', :buyer_id, "
        ":seller_id, :goods_id, :price, 'pending_payment', :now, :pay_deadline, :now)",
        key="order_id",
    ),
    Step(
        "line",
        "INSERT INTO order_lines (order_id, kind, item_id, label, quantity, price) "
        "VALUES (:order_id, 'goods', :goods_id, :title, 1, :price)",
    ),
    Step(
        "hold goods",
        "UPDATE goods SET reserved_order_id = :order_id, updated_at = :now WHERE id = :goods_id "
        "AND status = 'on_sale' AND reserved_order_id IS NULL",
        missing=UNAVAILABLE,
    ),
    Step(
        "timers",
        f"INSERT INTO timers ({_TIMER_COLUMNS}) VALUES "
        "(:order_id, 'cancel_unpaid', :pay_deadline, :pay_deadline, 'scheduled', 0, :no, :now), "
        "(:order_id, 'pay_reminder', :remind_at, :remind_at, 'scheduled', 0, :no, :now)",
    ),
    Step(
        "place event",
        "INSERT INTO order_events (order_id, at, event, actor, to_status, detail) "
        "VALUES (:order_id, :now, 'place', :actor, 'pending_payment', :detail)",
    ),
)

_NAME = re.compile(r"(?<![:\w]):([a-z_]+)")


@dataclass(frozen=True)
class Compiled:
    """A step in one driver's spelling: its SQL and the names of its parameters, in order."""

    step: Step
    sql: str
    names: tuple[str, ...]
    select: bool


def compiled(step: Step, dialect: str) -> Compiled:
    """``step`` with ``?`` (sqlite3), ``$n`` (asyncpg) or ``%s`` (asyncmy) for its names; on
    PostgreSQL an INSERT with a ``key`` returns the id (the others read ``lastrowid``)."""
    names = tuple(_NAME.findall(step.sql))
    if dialect == "postgresql":
        counter = iter(range(1, len(names) + 1))
        sql = _NAME.sub(lambda _: f"${next(counter)}", step.sql)
        if step.key:
            sql += f" RETURNING id AS {step.key}"
    else:
        sql = _NAME.sub("?" if dialect == "sqlite" else "%s", step.sql)
    return Compiled(step, sql, names, step.sql.lstrip().upper().startswith("SELECT"))


FMT = "%Y-%m-%d %H:%M:%S.%f"
#: The order's fields in dueflow's answer (the ones a new order leaves empty are null).
ORDER_FIELDS = [
    "id",
    "flow",
    "order_type",
    "buyer_id",
    "seller_id",
    "goods_id",
    "show_id",
    "amount",
    "status",
    "created_at",
    "pay_deadline",
    "paid_at",
    "ship_deadline",
    "shipped_at",
    "carrier",
    "tracking_no",
    "receive_deadline",
    "received_at",
    "review_deadline",
    "completed_at",
    "cancelled_at",
    "cancel_reason",
    "updated_at",
]


def sqlite_value(value: object) -> object:
    """As dueflow's SQLite columns hold it: times as naive UTC text, money as text."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None).strftime(FMT)
    if isinstance(value, Decimal):
        return str(value)
    return value


def naive_value(value: object) -> object:
    """As dueflow's PostgreSQL and MySQL columns hold it: times as naive UTC."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def request_values(token: str, goods_id: int) -> dict[str, Any]:
    """What the place needs before the first statement: the token's hash, the deadlines."""
    now = datetime.now(UTC)
    return {
        "token_hash": hashlib.sha256(token.encode()).hexdigest(),
        "goods_id": goods_id,
        "now": now,
        "pay_deadline": now + PAY,
        "remind_at": now + REMINDER,
        "no": False,
    }


#: What one statement gave: its rows (as dicts), the rows it changed, the new row's id.
Result = tuple[list[dict[str, Any]], int, int | None]


class Store:
    """One driver's way to run a statement, and :data:`PLACE` in one transaction on it."""

    def __init__(self, dialect: str) -> None:
        self.steps = [compiled(step, dialect) for step in PLACE]
        self.statements = 0

    async def open(self) -> None:
        """Connect (at the app's start)."""

    async def close(self) -> None:
        """Disconnect (at the app's end)."""

    async def place(self, values: dict[str, Any]) -> dict[str, Any]:
        """Every step in one transaction; the values found (a refusal rolls back)."""
        raise NotImplementedError

    async def run_steps(
        self, run: Callable[[Compiled], Awaitable[Result]], values: dict[str, Any]
    ) -> None:
        """Each step through ``run``, what it found added to ``values``, refusals raised."""
        for c in self.steps:
            rows, changed, new_id = await run(c)
            self.statements += 1
            step = c.step
            if step.missing and (not rows if c.select else changed == 0):
                raise Refusal(*step.missing)
            if rows:
                values.update(rows[0])
            if step.key and new_id is not None:
                values[step.key] = new_id
            if step.name == "user by token":
                values["actor"] = f"user:{values['buyer_id']}"
            elif step.name == "goods":
                values["detail"] = f"goods {values['goods_id']} for {values['price']}"
            if step.check is not None and (refusal := step.check(values)) is not None:
                raise Refusal(*refusal)


class SqliteStore(Store):
    """One stdlib connection, statements inline on the loop (SQLite answers in microseconds),
    with dueflow's pragmas."""

    def __init__(self, path: str) -> None:
        super().__init__("sqlite")
        self.path = path

    async def open(self) -> None:
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=5000"):
            self.conn.execute(f"PRAGMA {pragma}")
        self.conn.execute("PRAGMA foreign_keys=ON")

    async def close(self) -> None:
        self.conn.close()

    async def place(self, values: dict[str, Any]) -> dict[str, Any]:
        conn = self.conn

        async def run(c: Compiled) -> Result:
            cursor = conn.execute(c.sql, [sqlite_value(values[n]) for n in c.names])
            if not c.select:
                return [], cursor.rowcount, cursor.lastrowid
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()], 0, None

        conn.execute("BEGIN IMMEDIATE")
        try:
            await self.run_steps(run, values)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return values


class PostgresStore(Store):
    """An asyncpg pool (its prepared statement cache on, as dueflow's dialect has it)."""

    def __init__(self, url: str) -> None:
        super().__init__("postgresql")
        self.url = "postgresql://" + url.split("://", 1)[1]

    async def open(self) -> None:
        import asyncpg

        self.pool = await asyncpg.create_pool(self.url, min_size=1, max_size=POOL)

    async def close(self) -> None:
        await self.pool.close()

    async def place(self, values: dict[str, Any]) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():

            async def run(c: Compiled) -> Result:
                args = [naive_value(values[n]) for n in c.names]
                if c.select or c.step.key:
                    return [dict(row) for row in await conn.fetch(c.sql, *args)], 1, None
                status = await conn.execute(c.sql, *args)  # "UPDATE 1", "INSERT 0 2"
                return [], int(status.rsplit(" ", 1)[1]), None

            await self.run_steps(run, values)
        return values


class MysqlStore(Store):
    """An asyncmy pool, READ COMMITTED as dueflow sets it."""

    def __init__(self, url: str) -> None:
        super().__init__("mysql")
        self.parts = urlsplit(url)

    async def open(self) -> None:
        import asyncmy

        p = self.parts
        self.pool = await asyncmy.create_pool(
            host=p.hostname,
            port=p.port or 3306,
            user=p.username or "root",
            password=p.password or "",
            db=p.path.lstrip("/"),
            minsize=1,
            maxsize=POOL,
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )

    async def close(self) -> None:
        self.pool.close()
        await self.pool.wait_closed()

    async def place(self, values: dict[str, Any]) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            await conn.begin()
            try:
                async with conn.cursor() as cursor:

                    async def run(c: Compiled) -> Result:
                        await cursor.execute(c.sql, [naive_value(values[n]) for n in c.names])
                        if not c.select:
                            return [], cursor.rowcount, cursor.lastrowid
                        names = [d[0] for d in cursor.description]
                        rows = await cursor.fetchall()
                        return [dict(zip(names, row, strict=True)) for row in rows], 0, None

                    await self.run_steps(run, values)
            except BaseException:
                await conn.rollback()
                raise
            await conn.commit()
        return values


def store_for(url: str) -> Store:
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        return SqliteStore(url.split(":///", 1)[1])
    if scheme in ("postgresql", "postgres"):
        return PostgresStore(url)
    if scheme in ("mysql", "mariadb"):
        return MysqlStore(url)
    raise SystemExit(f"unsupported database {scheme!r}")


def _plain(value: object) -> object:
    """What orjson does not encode itself: money as text."""
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(type(value).__name__)


def answer(values: dict[str, Any]) -> bytes:
    """The new order as dueflow answers it (its line, timers and timeline), built from what
    the transaction wrote."""
    v = values
    order = dict.fromkeys(ORDER_FIELDS)
    order.update(
        id=v["order_id"],
        flow="marketplace",
        order_type="normal",
        buyer_id=v["buyer_id"],
        seller_id=v["seller_id"],
        goods_id=v["goods_id"],
        amount=v["price"],
        status="pending_payment",
        created_at=v["now"],
        pay_deadline=v["pay_deadline"],
        updated_at=v["now"],
    )
    line = {"kind": "goods", "item_id": v["goods_id"], "label": v["title"], "quantity": 1}
    timers = [
        {"order_id": v["order_id"], "kind": kind, "deadline_at": at, "due_at": at}
        | {"state": "scheduled", "attempts": 0, "stuck": False, "created_at": v["now"]}
        for kind, at in (("cancel_unpaid", v["pay_deadline"]), ("pay_reminder", v["remind_at"]))
    ]
    event = {"order_id": v["order_id"], "at": v["now"], "event": "place", "actor": v["actor"]}
    event |= {"to_status": "pending_payment", "detail": v["detail"]}
    order |= {"lines": [line | {"price": v["price"]}], "timers": timers, "timeline": [event]}
    return orjson.dumps(order, default=_plain)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def respond(send: Send, status: int, body: bytes, kind: bytes = b"application/json") -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]}
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].decode("latin-1").strip() or None
    return None


def error(code: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": code.replace("_", " ")}})


def create_app() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI app over the database at ``$REFERENCE_DATABASE_URL``."""
    store = store_for(os.environ[ENV_URL])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] == "http":
            await http(scope, receive, send)

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await store.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await store.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/api/orders" and method == "POST":
            await place(scope, await read_body(receive), send)
        elif path == "/healthz":
            await respond(send, 200, b'{"status":"ok"}')
        elif path == "/metrics":
            text = f"reference_db_statements_total {store.statements}\n".encode()
            await respond(send, 200, text, b"text/plain; version=0.0.4")
        else:
            await respond(send, 404, error("not_found"))

    async def place(scope: Scope, body: bytes, send: Send) -> None:
        token = bearer(scope)
        if token is None:
            await respond(send, 401, error(UNAUTHORIZED[1]))
            return
        try:
            goods_id = orjson.loads(body)["goods_id"]
            if not isinstance(goods_id, int) or isinstance(goods_id, bool):
                raise TypeError
        except (orjson.JSONDecodeError, KeyError, TypeError):
            await respond(send, 422, error("invalid_request"))
            return
        try:
            values = await store.place(request_values(token, goods_id))
        except Refusal as refusal:
            await respond(send, refusal.status, error(refusal.code))
            return
        except Exception as exc:
            # As dueflow does: the driver's text stays in the server's log, never the answer.
            print(f"place failed: {exc!r}", file=sys.stderr)
            await respond(send, 503, error("backend_unavailable"))
            return
        await respond(send, 201, answer(values))

    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    args = parser.parse_args()
    if args.workers > 1 and args.database_url.startswith("sqlite"):
        sys.exit("SQLite has one writer: the reference stays one process on it")
    os.environ[ENV_URL] = args.database_url
    uvicorn.run(
        "reference_server:create_app",
        factory=True,
        app_dir=str(Path(__file__).parent),
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
