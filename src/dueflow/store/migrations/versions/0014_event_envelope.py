"""event envelope: each order event's data (structured) and the order's snapshot after it"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    # Events written before have neither: their envelopes carry the move alone and no order.
    with op.batch_alter_table("order_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("snapshot", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("order_events", schema=None) as batch_op:
        batch_op.drop_column("snapshot")
        batch_op.drop_column("data")
