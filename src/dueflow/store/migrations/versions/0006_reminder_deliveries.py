"""reminder deliveries"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    # Rows sent before this revision count as delivered once (the most they can show for sure).
    with op.batch_alter_table("reminders", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("deliveries", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
    op.execute("UPDATE reminders SET deliveries = 1 WHERE state = 'sent'")


def downgrade() -> None:
    with op.batch_alter_table("reminders", schema=None) as batch_op:
        batch_op.drop_column("deliveries")
