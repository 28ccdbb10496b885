"""service keys: the api_keys table; a host's own id and name for the users keys act for"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import ExactText, Id, UTCDateTime

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", Id, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.String(length=255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.Column("rotated_from", Id, nullable=True),
        sa.ForeignKeyConstraint(
            ["rotated_from"], ["api_keys.id"], name=op.f("fk_api_keys_rotated_from_api_keys")
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_keys_secret_hash")),
    )
    # Users made before this revision are dueflow's own: no host id, no display name.
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("external_id", ExactText, nullable=True))
        batch_op.add_column(sa.Column("display_name", sa.String(length=255), nullable=True))
        batch_op.create_unique_constraint(op.f("uq_users_external_id"), ["external_id"])


def downgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("uq_users_external_id"), type_="unique")
        batch_op.drop_column("display_name")
        batch_op.drop_column("external_id")
    op.drop_table("api_keys")
