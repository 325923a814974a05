"""Alembic environment of Kiln's tuning database.

Kiln runs these migrations through :mod:`db.migrate` (``kiln db upgrade``), which passes an open connection
in ``config.attributes["connection"]``. Run directly with the alembic CLI (for developers writing a new
revision), the URL comes from ``sqlalchemy.url`` in the config or the usual ``--db``/``KILN_DB`` resolution.
Only ``kiln_*`` tables are considered, so Optuna's tables in the same database are never touched.
"""

from __future__ import annotations

from alembic import context

from db.migrate import VERSION_TABLE
from db.models import Base


def _include_name(name, type_, parent_names):  # type: ignore[no-untyped-def]
    if type_ == "table":
        return bool(name) and name.startswith("kiln_")
    return True


def _configure_and_run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,
        include_name=_include_name,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    from db.engine import make_engine, resolve_url

    url = resolve_url(context.config.get_main_option("sqlalchemy.url"))
    engine = make_engine(url)
    with engine.connect() as conn:
        _configure_and_run(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("Kiln's migrations run online only (kiln db upgrade)")
run_migrations_online()
