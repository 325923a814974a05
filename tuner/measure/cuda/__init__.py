"""Measuring candidates of cuda targets with CuPy: the ``local`` builder and runner of the cuda kind.

- :class:`~tuner.measure.cuda.build.LocalBuilder` (``build.py``): checks, schedules, lowers and prints
  each candidate as its own CUDA translation unit and compiles it with NVRTC
  (:func:`compiler.backends.cuda.nvrtc.build`, cubins cached by source + options + arch) in a pool of worker
  processes, one job per candidate with its own timeout; keeps the kernels' registers / shared / local
  memory in ``BuildResult.info``;
- :class:`~tuner.measure.cuda.run.LocalRunner` (``run.py``): verifies each candidate against the numpy
  reference and times it with CUDA events in a spawned worker that owns the CUDA context
  (``run_worker.py``), restarted after a sticky CUDA error or a hang.

Both take ``cupy_module``: the name of a module the worker processes import as ``cupy`` (default: CuPy
itself). That is the simulation hook of the tests (``tests.compiler.backends.cuda.fake_cupy`` runs kernels
in the SIMT interpreter and injects faults), so the whole path is tested without a GPU.
"""

from __future__ import annotations

from tuner.measure.cuda.build import LocalBuilder
from tuner.measure.cuda.run import LocalRunner

__all__ = ["LocalBuilder", "LocalRunner"]
