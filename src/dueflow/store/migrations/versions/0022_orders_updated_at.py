"""the dashboard stays fast: orders by when they last moved, the live orders by their deadline,
and the counts of orders in a final status kept up to a watermark"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import UTCDateTime

revision = "0022"
down_revision = "0021"

#: As store/_schema_orders.py declares them, written out so the migration stays what it was.
DEADLINES = {
    "ix_orders_pay_due": ("pay_deadline", "pending_payment"),
    "ix_orders_ship_due": ("ship_deadline", "pending_shipment"),
    "ix_orders_receive_due": ("receive_deadline", "shipped"),
    "ix_orders_review_due": ("review_deadline", "received"),
}
#: As store/_schema_timers.py declares it.
STUCK_TIMERS = "stuck AND state IN ('scheduled', 'claimed')"
#: MySQL has no partial index: there the deadlines check walks ix_orders_status, the stuck
#: timers ix_timers_live.
PARTIAL = ("postgresql", "sqlite")


def upgrade() -> None:
    op.create_index("ix_orders_updated_at", "orders", ["updated_at"], unique=False)
    if op.get_bind().dialect.name in PARTIAL:
        for name, (column, status) in DEADLINES.items():
            where = sa.text(f"status = '{status}'")
            op.create_index(name, "orders", [column], postgresql_where=where, sqlite_where=where)
        stuck = sa.text(STUCK_TIMERS)
        op.create_index(
            "ix_timers_stuck",
            "timers",
            ["due_at", "id"],
            postgresql_where=stuck,
            sqlite_where=stuck,
        )
    op.create_table(
        "order_counts",
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("orders", sa.BigInteger(), nullable=False),
        sa.Column("upto", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("status"),
    )


def downgrade() -> None:
    op.drop_table("order_counts")
    if op.get_bind().dialect.name in PARTIAL:
        op.drop_index("ix_timers_stuck", table_name="timers")
        for name in DEADLINES:
            op.drop_index(name, table_name="orders")
    op.drop_index("ix_orders_updated_at", table_name="orders")
