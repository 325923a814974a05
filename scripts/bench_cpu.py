#!/usr/bin/env python
"""CPU benchmark: a thin wrapper over `kiln bench --suite zoo` (the methodology, the contenders and the
report are `kiln bench`'s: tuner/bench/). Every argument is passed on:

    python scripts/bench_cpu.py --db sqlite:///kiln.db --out benchmarks/cpu_tuned.md
    # is: kiln bench --suite zoo --db sqlite:///kiln.db --out benchmarks/cpu_tuned.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "--suite", "zoo", *sys.argv[1:]]))
