"""payment start answer"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    # Nullable: attempts started before this revision count as unknown (the cautious reading).
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("start_answer", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.drop_column("start_answer")
