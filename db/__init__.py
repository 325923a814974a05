"""Kiln tuning database (SQLAlchemy): records, workloads, targets, runs."""
