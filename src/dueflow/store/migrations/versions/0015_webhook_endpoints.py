"""webhook endpoints: the API-made endpoints, and which one each delivery stream serves"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, UTCDateTime

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("previous_secret", sa.String(100)),
        sa.Column("previous_until", UTCDateTime()),
        sa.Column("event_types", sa.String(1000)),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("description", sa.String(200)),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # The streams so far all serve the settings' endpoint (NULL).
    with op.batch_alter_table("event_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("endpoint_id", Id))


def downgrade() -> None:
    with op.batch_alter_table("event_deliveries", schema=None) as batch_op:
        batch_op.drop_column("endpoint_id")
    op.drop_table("webhook_endpoints")
