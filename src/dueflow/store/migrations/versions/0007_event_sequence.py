"""event sequence"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, UTCDateTime

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("order_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("seq", sa.BigInteger(), nullable=True))
    # Every event recorded before this revision has committed: id order is their commit order.
    op.execute("UPDATE order_events SET seq = id")
    op.create_index("ix_order_events_seq", "order_events", ["seq"], unique=True)
    op.create_index("ix_order_events_order_id_seq", "order_events", ["order_id", "seq"])
    op.create_table(
        "event_sequence",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute(
        "INSERT INTO event_sequence (id, last_seq) SELECT 1, COALESCE(MAX(seq), 0) FROM order_events"
    )
    op.create_table(
        "event_deliveries",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("delivered_seq", sa.BigInteger(), nullable=False),
        sa.Column("until_seq", sa.BigInteger(), nullable=True),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_error_at", UTCDateTime(), nullable=True),
        sa.Column("retry_at", UTCDateTime(), nullable=True),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.Column("requested_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("done_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", name=op.f("uq_event_deliveries_name")),
    )


def downgrade() -> None:
    op.drop_table("event_deliveries")
    op.drop_table("event_sequence")
    op.drop_index("ix_order_events_order_id_seq", table_name="order_events")
    op.drop_index("ix_order_events_seq", table_name="order_events")
    with op.batch_alter_table("order_events", schema=None) as batch_op:
        batch_op.drop_column("seq")
