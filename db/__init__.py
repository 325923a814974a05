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
- ``selection``: the rule that picks the record compile applies (confirmations first; ``select_record``)
- ``exchange``: JSON Lines export/import and merge (``importer``: the import side)
- ``canonical``: canonical JSON (from :mod:`compiler.canonical`), timestamps, record fingerprints
- ``testing``: a throwaway PostgreSQL server for tests and benchmarks

The ``kiln query`` and ``kiln db`` commands live in ``tuner/commands/`` (query.py, db.py): db imports
nothing from tuner or cost_model, only compiler (errors, canonical JSON). See docs/database.md. Importing
this package does not import SQLAlchemy.
"""
