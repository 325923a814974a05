"""Kiln tuner: tasks, search, measurement, scheduling and the `kiln` CLI."""
