#!/usr/bin/env python
"""CPU benchmark: Kiln (default schedules, or tuned records with --db) vs numpy, onnxruntime and, when
importable, torch eager and torch.compile, all timed in one run, interleaved, plus the machine's copy
bandwidth and numpy SGEMM as ceilings. Every contender's output is checked against the numpy reference
before it is timed. Writes a markdown table (with the CPU and date) when --out is given.

    python scripts/bench_cpu.py --out benchmarks/cpu_default.md
    python scripts/bench_cpu.py --db sqlite:///kiln.db --out benchmarks/cpu_tuned.md   # default vs tuned
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_common import (
    THREADS,
    copy_bandwidth_gbs,
    interleaved,
    machine_line,
    markdown_table,
    numpy_sgemm_gflops,
    ort_runner,
    torch_runners,
)
from scripts.numpy_peer import peer_for

DEFAULT_MODELS = ["softmax_large", "rmsnorm", "layernorm", "bias_gelu", "matmul", "mlp", "encoder_layer"]
FUSED_CHAINS = {"softmax_large", "rmsnorm", "layernorm", "bias_gelu"}


def _check(name: str, who: str, got, refs) -> None:
    got = got if isinstance(got, (list, tuple)) else [got]
    for g, r in zip(got, refs):
        g = g.detach().numpy() if hasattr(g, "detach") else np.asarray(g)
        err = float(np.abs(g.reshape(r.shape) - r).max() / max(1.0, np.abs(r).max()))
        if err > 1e-3:
            raise SystemExit(f"{who} computes {name} wrong: max rel err {err:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--db", help="also compile with the best records of this tuning database (tuned column)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per contender per round")
    ap.add_argument("--out", help="write the markdown table here")
    args = ap.parse_args()

    from compiler.frontend.models import get_model
    from compiler.reference import random_inputs, run_reference
    from tuner.api import compile as kiln_compile

    rows = []
    peers_missing: set[str] = set()
    for name in args.models:
        graph = get_model(name)
        inputs = random_inputs(graph, seed=0)
        refs = run_reference(graph, inputs)
        contenders = {}
        model = kiln_compile(graph, "cpu")
        _check(name, "kiln default", model.run(inputs), refs)
        contenders["kiln default"] = lambda m=model, x=inputs: m.run(x, copy=False)
        if args.db:
            from db.database import TuningDatabase

            tuned = kiln_compile(graph, "cpu", db=TuningDatabase.open(args.db, create=False))
            _check(name, "kiln tuned", tuned.run(inputs), refs)
            contenders["kiln tuned"] = lambda m=tuned, x=inputs: m.run(x, copy=False)
        np_fn = peer_for(name, graph, inputs)
        if np_fn is not None:
            _check(name, "numpy", np_fn(), refs)
            contenders["numpy"] = np_fn
        ort = ort_runner(graph, inputs)
        if ort is None:
            peers_missing.add("onnxruntime")
        else:
            _check(name, "onnxruntime", ort(), refs)
            contenders["onnxruntime"] = ort
        torch_fns = torch_runners(graph, inputs)
        if not torch_fns:
            peers_missing.add("torch")
        for who, fn in torch_fns.items():
            _check(name, who, fn(), refs)
            contenders[who] = fn
        times = interleaved(contenders, args.rounds, args.min_time)
        kiln = times.get("kiln tuned", times["kiln default"])
        peers = {k: v for k, v in times.items() if not k.startswith("kiln")}
        best_peer = min(peers, key=peers.get) if peers else None
        row = {"workload": name, **{k: f"{v:,.0f}" for k, v in times.items()}}
        if "onnxruntime" in times:
            row["kiln vs onnxruntime"] = f"{times['onnxruntime'] / kiln:.2f}x"
        if "numpy" in times:
            row["kiln vs numpy"] = f"{times['numpy'] / kiln:.2f}x"
        if best_peer:
            row["kiln vs best peer"] = f"{peers[best_peer] / kiln:.2f}x ({best_peer})"
        if "kiln tuned" in times:
            row["tuned vs default"] = f"{times['kiln default'] / times['kiln tuned']:.2f}x"
        nbytes = sum(a.nbytes for a in inputs) + sum(r.nbytes for r in refs)
        row["kiln GB/s"] = f"{nbytes / (kiln * 1e-6) / 1e9:.1f}"
        if name == "matmul":
            row["kiln GFLOP/s"] = f"{2 * 1024**3 / (kiln * 1e-6) / 1e9:.0f}"
        rows.append(row)
        print({k: row[k] for k in row}, flush=True)

    copy_bw, sgemm = copy_bandwidth_gbs(), numpy_sgemm_gflops()
    cols = (
        ["workload", "kiln default"]
        + (["kiln tuned"] if args.db else [])
        + [c for c in ("numpy", "onnxruntime", "torch eager", "torch.compile") if any(c in r for r in rows)]
    )
    cols += [
        c
        for c in (
            "tuned vs default",
            "kiln vs onnxruntime",
            "kiln vs numpy",
            "kiln vs best peer",
            "kiln GB/s",
            "kiln GFLOP/s",
        )
        if any(c in r for r in rows)
    ]
    table = markdown_table(rows, cols)
    text = (
        f"# Kiln CPU benchmark ({'default and tuned' if args.db else 'default'} schedules)\n\n"
        f"Machine: {machine_line()}. Median latency in microseconds, median of {args.rounds} interleaved "
        f"rounds; float32, {THREADS} threads for every contender. Kiln and onnxruntime reuse their output "
        f"buffers; numpy and torch allocate outputs per call. Every output was checked against the numpy "
        f"reference first.\n\nCeilings measured in the same run: copy bandwidth {copy_bw:.1f} GB/s "
        f"(read + write), numpy SGEMM 1024^3 {sgemm:.0f} GFLOP/s.\n"
        f"{'Peers not importable: ' + ', '.join(sorted(peers_missing)) + chr(10) if peers_missing else ''}"
        f"\n{table}\n"
    )
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
