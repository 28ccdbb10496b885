"""provider refunds: what a provider gave back of an attempt on its own"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Money

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    # Nullable: no provider gave back anything of the attempts made before this revision that
    # dueflow knew of.
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("provider_refunded", Money(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("payments", schema=None) as batch_op:
        batch_op.drop_column("provider_refunded")
