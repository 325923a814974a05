"""Kiln compiler: graph IR, op library, passes, fusion, loop IR, sketches, codegen and runtime.

Importing this package is cheap: heavy optional dependencies (optuna, sqlalchemy, cupy, onnx) are
imported lazily by the modules that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"
