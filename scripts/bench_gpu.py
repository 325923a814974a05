#!/usr/bin/env python
"""GPU benchmark: a thin wrapper over ``kiln bench --target cuda`` (contenders: Kiln plain and replaying a
CUDA Graph, Kiln with the tuned records of ``--db``, torch eager, torch.compile default and max-autotune,
cuBLAS through CuPy for a single matmul; device copy and cuBLAS SGEMM ceilings measured in the same run).
The built-in models of ``--models`` become a suite file; every other argument goes to `kiln bench`.

    python scripts/bench_gpu.py --models matmul rmsnorm --json bench.json --db sqlite:///tune.db
    # is: kiln bench --target cuda --suite SUITE.toml --json bench.json --db sqlite:///tune.db
    python scripts/bench_gpu.py --dry-run --models matmul    # no GPU: build the CUDA code, time nothing

``--dry-run`` compiles each model for cuda (NVRTC is not needed: the source and launch plan are built) and
checks the torch peer on the CPU against the numpy reference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ZOO = ["softmax_large", "rmsnorm", "layernorm", "bias_gelu", "matmul", "mlp", "attention", "encoder_layer"]


def dry_run(models: list[str], db_url: str | None) -> int:
    import numpy as np

    from compiler.build import compile as kiln_compile
    from compiler.frontend.models import get_model
    from compiler.reference import random_inputs, run_reference
    from tuner.api import compile as tuned_compile
    from tuner.bench.runner import rel_err

    db = None
    if db_url:
        from db.database import TuningDatabase

        db = TuningDatabase.open(db_url, create=False)
    for name in models:
        t0 = time.perf_counter()
        graph = get_model(name)
        model = kiln_compile(graph, "cuda")
        kernels = sum(len(v) for v in model.kernel_launches.values())
        note = ""
        try:
            import torch

            from tuner.bench.torch_peer import graph_to_torch

            inputs = random_inputs(graph, seed=0)
            with torch.no_grad():
                got = graph_to_torch(graph)(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))
            got = got if isinstance(got, tuple) else (got,)
            err = rel_err(got, run_reference(graph, inputs), lambda t: t.numpy())
            note = f", torch peer err {err:.1e}" + ("" if err <= 1e-3 else " (WRONG)")
        except ImportError:
            note = ", torch not installed"
        if db is not None:
            tuned = tuned_compile(graph, "cuda", db=db)
            from_records = sum(1 for k in tuned.kernels if k.extra.get("origin") == "record")
            note += f", {from_records}/{len(tuned.kernels)} kernels from records"
        print(f"  {name}: {kernels} kernels, {len(model.source) // 1024} KiB of CUDA, "
              f"{time.perf_counter() - t0:.1f} s{note}")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=ZOO, help="built-in models to time")
    ap.add_argument("--dry-run", action="store_true", help="build the CUDA code only (no GPU needed)")
    args, rest = ap.parse_known_args()
    if args.dry_run:
        db = rest[rest.index("--db") + 1] if "--db" in rest else None
        return dry_run(args.models, db)
    suite = Path(tempfile.mkdtemp(prefix="kiln-bench-gpu-")) / "gpu.toml"
    suite.write_text("".join(f'[[workload]]\nmodel = "{m}"\n' for m in args.models))
    from tuner.cli import main as kiln

    return kiln(["bench", "--target", "cuda", "--suite", str(suite), *rest])


if __name__ == "__main__":
    raise SystemExit(main())
