"""The database: schema, migrations, and one module of named statements per table."""
