"""notification inbox"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, UTCDateTime

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("body", sa.LargeBinary(length=1048576), nullable=False),
        sa.Column("body_truncated", sa.Boolean(), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("pay_no", sa.String(length=32), nullable=True),
        sa.Column("event", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_notifications_pay_no"), ["pay_no"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_notifications_pay_no"))

    op.drop_table("notifications")
