"""Kiln tuning database (SQLAlchemy 2): every measurement, the best record per kernel and target.

- ``database``: :class:`~db.database.TuningDatabase` (open, commit, best, top_k, records, coverage, ...),
  assembled from ``core`` (connections, keys), ``queries`` (the read side) and ``aux_tables`` (runs, model
  tasks, fusion plans, features)
- ``records``: the plain dataclasses that cross the boundary (``RecordIn``, ``Record``, ``ImportStats``)
- ``status``: :class:`~db.status.Status` (ok, compile_error, runtime_error, timeout, wrong_result,
  invalid_config)
- ``models``: the ORM tables (``kiln_*``); ``migrate`` and ``migrations/``: alembic, version table
  ``kiln_alembic_version``
- ``engine``: URL resolution (``--db``, ``KILN_DB``, ``sqlite:///kiln.db``) and engines; ``errors``
- ``exchange``: JSON Lines export/import and merge; ``cli``: ``kiln query`` and ``kiln db``
- ``testing``: a throwaway PostgreSQL server for tests and benchmarks

See docs/database.md. Importing this package (or ``db.cli``) does not import SQLAlchemy.
"""
