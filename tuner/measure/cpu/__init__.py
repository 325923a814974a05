"""Measuring candidates of cpu targets on this machine: the ``local`` builder and runner of the cpu kind.

- :class:`~tuner.measure.cpu.build.LocalBuilder` (``build.py``): checks, schedules, lowers and prints
  candidates in a pool of worker processes and compiles each chunk with one gcc call
  (:func:`compiler.backends.cpu.gcc.compile_to`), blaming gcc's errors on the candidates that own them;
- :class:`~tuner.measure.cpu.run.LocalRunner` (``run.py``): verifies each candidate against the numpy
  reference and times it in an isolated worker process (``run_worker.py``) through a C timing harness
  (``harness.py``).

:func:`tuner.measure.create_builder` / :func:`~tuner.measure.create_runner` find this package by the
target's kind (``tuner.measure.<kind>`` exporting ``LocalBuilder`` and ``LocalRunner``).
"""

from __future__ import annotations

from tuner.measure.cpu.build import LocalBuilder
from tuner.measure.cpu.run import LocalRunner

__all__ = ["LocalBuilder", "LocalRunner"]
