"""idempotent POSTs: an Idempotency-Key belongs to a principal (``user:<id>``) and names the
route it came with; a claim's lease, and the effect a provider route made first

Placing's keys so far are kept: each becomes its buyer's (``user:<buyer_id>``) on
``POST /api/orders``, its hash and answer as they were, so a repeat within 24 h still answers the
first order. Down again, only placing's keys can be kept (the others name no order): their buyer
is their order's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from dueflow.store.types import Id, UTCDateTime

revision = "0017"
down_revision = "0016"

_keys = sa.table(
    "idempotency_keys",
    sa.column("buyer_id", Id),
    sa.column("principal", sa.String),
    sa.column("method", sa.String),
    sa.column("route", sa.String),
    sa.column("order_id", Id),
)
_orders = sa.table("orders", sa.column("id", Id), sa.column("buyer_id", Id))


def upgrade() -> None:
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("principal", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("method", sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column("route", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("effect_id", Id, nullable=True))
        batch_op.add_column(sa.Column("locked_until", UTCDateTime(), nullable=True))
    op.execute(
        _keys.update().values(
            principal=sa.literal("user:") + sa.cast(_keys.c.buyer_id, sa.String),
            method="POST",
            route="/api/orders",
        )
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_constraint("fk_idempotency_keys_buyer_id_users", type_="foreignkey")
        batch_op.drop_constraint("uq_idempotency_keys_buyer_id_key", type_="unique")
        batch_op.drop_column("buyer_id")
        for name, length in (("principal", 64), ("method", 8), ("route", 200)):
            batch_op.alter_column(
                name, existing_type=sa.String(length=length), existing_nullable=True, nullable=False
            )
        batch_op.alter_column("order_id", existing_type=Id, existing_nullable=False, nullable=True)
        batch_op.create_unique_constraint("uq_idempotency_keys_principal_key", ["principal", "key"])


def downgrade() -> None:
    op.execute(_keys.delete().where(_keys.c.order_id.is_(None)))
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("buyer_id", Id, nullable=True))
    buyer = sa.select(_orders.c.buyer_id).where(_orders.c.id == _keys.c.order_id).scalar_subquery()
    op.execute(_keys.update().values(buyer_id=buyer))
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_constraint("uq_idempotency_keys_principal_key", type_="unique")
        for name in ("principal", "method", "route", "effect_id", "locked_until"):
            batch_op.drop_column(name)
        batch_op.alter_column("buyer_id", existing_type=Id, existing_nullable=True, nullable=False)
        batch_op.alter_column("order_id", existing_type=Id, existing_nullable=True, nullable=False)
        batch_op.create_foreign_key(
            "fk_idempotency_keys_buyer_id_users", "users", ["buyer_id"], ["id"]
        )
        batch_op.create_unique_constraint("uq_idempotency_keys_buyer_id_key", ["buyer_id", "key"])
