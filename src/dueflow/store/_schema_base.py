"""What every table shares: the metadata (its naming convention) and the id type."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, MetaData

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

# SQLite needs INTEGER PRIMARY KEY for rowid aliasing; elsewhere ids are 64-bit.
Id = BigInteger().with_variant(Integer(), "sqlite")
