"""The state store: SQLite schema, migrations and typed rows."""
