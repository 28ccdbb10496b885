"""flows and tickets: orders.profile becomes orders.flow, order lines, shows, seats, seat holds,
per-buyer seat counts and tickets"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, Money, UTCDateTime

revision = "0009"
down_revision = "0008"


def _id() -> sa.Column[int]:
    return sa.Column("id", Id, autoincrement=True, nullable=False)


def upgrade() -> None:
    op.create_table(
        "shows",
        _id(),
        sa.Column("organizer_id", Id, nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("venue", sa.String(length=200), nullable=False),
        sa.Column("starts_at", UTCDateTime(), nullable=False),
        sa.Column("sales_close_at", UTCDateTime(), nullable=False),
        sa.Column("seat_limit", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cancelled_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["organizer_id"], ["users.id"], name="fk_shows_organizer_id_users"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_shows_organizer_id_id", "shows", ["organizer_id", "id"])
    op.create_table(
        "seats",
        _id(),
        sa.Column("show_id", Id, nullable=False),
        sa.Column("label", sa.String(length=16), nullable=False),
        sa.Column("section", sa.String(length=8), nullable=False),
        sa.Column("row", sa.String(length=8), nullable=True),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("price", Money(precision=12, scale=2), nullable=False),
        sa.ForeignKeyConstraint(["show_id"], ["shows.id"], name="fk_seats_show_id_shows"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("show_id", "label", name="uq_seats_show_id_label"),
    )
    op.create_table(
        "show_buyers",
        sa.Column("show_id", Id, autoincrement=False, nullable=False),
        sa.Column("buyer_id", Id, autoincrement=False, nullable=False),
        sa.Column("seats", sa.Integer(), nullable=False),
        sa.CheckConstraint("seats >= 0", name="ck_show_buyers_seats_not_negative"),
        sa.ForeignKeyConstraint(["buyer_id"], ["users.id"], name="fk_show_buyers_buyer_id_users"),
        sa.ForeignKeyConstraint(["show_id"], ["shows.id"], name="fk_show_buyers_show_id_shows"),
        sa.PrimaryKeyConstraint("show_id", "buyer_id"),
    )
    op.create_table(
        "order_lines",
        _id(),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("item_id", Id, nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("price", Money(precision=12, scale=2), nullable=False),
        sa.ForeignKeyConstraint(["order_id"], ["orders.id"], name="fk_order_lines_order_id_orders"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_order_lines_order_id", "order_lines", ["order_id"])
    op.create_table(
        "seat_holds",
        _id(),
        sa.Column("show_id", Id, nullable=False),
        sa.Column("seat_id", Id, nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("buyer_id", Id, nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["buyer_id"], ["users.id"], name="fk_seat_holds_buyer_id_users"),
        sa.ForeignKeyConstraint(["order_id"], ["orders.id"], name="fk_seat_holds_order_id_orders"),
        sa.ForeignKeyConstraint(["seat_id"], ["seats.id"], name="fk_seat_holds_seat_id_seats"),
        sa.ForeignKeyConstraint(["show_id"], ["shows.id"], name="fk_seat_holds_show_id_shows"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("show_id", "seat_id", name="uq_seat_holds_show_id_seat_id"),
    )
    op.create_index("ix_seat_holds_order_id", "seat_holds", ["order_id"])
    op.create_table(
        "tickets",
        _id(),
        sa.Column("code", sa.String(length=32), nullable=False),
        sa.Column("order_id", Id, nullable=False),
        sa.Column("show_id", Id, nullable=False),
        sa.Column("seat_id", Id, nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("voided_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["order_id"], ["orders.id"], name="fk_tickets_order_id_orders"),
        sa.ForeignKeyConstraint(["seat_id"], ["seats.id"], name="fk_tickets_seat_id_seats"),
        sa.ForeignKeyConstraint(["show_id"], ["shows.id"], name="fk_tickets_show_id_shows"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("code", name="uq_tickets_code"),
    )
    op.create_index("ix_tickets_order_id", "tickets", ["order_id"])
    # SQLite rebuilds the table (store/migrate.py runs its migrations with foreign keys off).
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.alter_column(
            "profile", new_column_name="flow", existing_type=sa.String(32), existing_nullable=False
        )
        batch_op.alter_column("goods_id", existing_type=Id, nullable=True)
        batch_op.add_column(sa.Column("show_id", Id, nullable=True))
        batch_op.create_index("ix_orders_show_id", ["show_id"])
        batch_op.create_foreign_key("fk_orders_show_id_shows", "shows", ["show_id"], ["id"])
    # Every order so far holds one goods item: its line, as placing writes one from now on.
    op.execute(
        "INSERT INTO order_lines (order_id, kind, item_id, label, quantity, price) "
        "SELECT orders.id, 'goods', orders.goods_id, goods.title, 1, orders.amount "
        "FROM orders JOIN goods ON goods.id = orders.goods_id ORDER BY orders.id"
    )


def downgrade() -> None:
    # Orders without goods (tickets) have no place in the older schema: go back only without them.
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.drop_constraint("fk_orders_show_id_shows", type_="foreignkey")
        batch_op.drop_index("ix_orders_show_id")
        batch_op.drop_column("show_id")
        batch_op.alter_column("goods_id", existing_type=Id, nullable=False)
        batch_op.alter_column(
            "flow", new_column_name="profile", existing_type=sa.String(32), existing_nullable=False
        )
    for table in ("tickets", "seat_holds", "order_lines", "show_buyers", "seats", "shows"):
        op.drop_table(table)
