#!/usr/bin/env python
"""ONNX benchmark: Kiln (default schedules, and tuned records) vs onnxruntime on the CPU, on ONNX files.

The nets are the ONNX tests' nets at benchmark sizes (``tests/compiler/frontend/onnx_nets.py``: MLP,
conv-bn-relu-pool, ResNet basic block, BERT-style encoder layer, GPT-style block with causal attention,
RMSNorm + SwiGLU MLP) plus the zoo's ``encoder_layer`` written by ``export_onnx``. Each is saved as an
ONNX file, then:

1. tuned: ``kiln tune --model FILE.onnx --trials N --db URL`` per net (a subprocess, before any timing);
2. loaded back from the file three ways: onnxruntime (an InferenceSession on the file, CPU provider,
   ORT_ENABLE_ALL, sequential, ``intra_op_num_threads`` = this machine's cores, as Kiln uses), Kiln with
   default schedules, Kiln with the database's best records (``tuner.api.compile(graph, "cpu", db=...)``);
3. checked: onnxruntime against the numpy reference, both Kiln models against onnxruntime
   (max|err| <= 1e-4 * max(1, max|ref|));
4. timed in one process, interleaved: every round times each contender (in a rotating order) for
   ``--min-time`` seconds and keeps its median; the table gives the median of the round medians and the
   spread of the round medians (this machine is shared, other jobs make it noisy).

    python scripts/bench_onnx.py --out benchmarks/onnx.md                    # tune (default trials) + time
    python scripts/bench_onnx.py --trials 0 --db sqlite:///bench_onnx.db     # time with the records there
    python scripts/bench_onnx.py --nets mlp gpt_block --trials 100 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_common import THREADS, machine_line, markdown_table, time_fn  # noqa: E402

NET_ORDER = [
    "mlp",
    "conv_bn_relu_pool",
    "resnet_block",
    "encoder_layer",
    "gpt_block",
    "rmsnorm_swiglu",
    "zoo_encoder_layer",
]
SHAPES = {
    "mlp": "x[256,784]: Gemm 784-128, ReLU, Gemm 128-10",
    "conv_bn_relu_pool": "x[8,3,32,32]: Conv3x3-BN-ReLU-MaxPool, Conv3x3-ReLU, GAP, Gemm",
    "resnet_block": "x[1,64,56,56]: 2x (Conv3x3 64-64 + BN), ReLU, residual",
    "encoder_layer": "x[1,128,256]: 4 heads, FF 1024, post-LN, erf GELU (opset 13 decomposed)",
    "gpt_block": "x[1,128,256]: 4 heads, causal (Trilu/Where), pre-LN, tanh GELU, opset 17",
    "rmsnorm_swiglu": "x[1,128,512]: RMSNorm, SwiGLU FF 1536, residual",
    "zoo_encoder_layer": "x[1,128,768]: zoo encoder_layer via export_onnx (12 heads, FF 3072)",
}


def write_nets(names: list[str], workdir: Path) -> dict[str, Path]:
    """Save each net as workdir/NAME.onnx (graph name = NAME, so tuning runs are told apart)."""
    import onnx

    from tests.compiler.frontend.onnx_nets import NETS

    paths = {}
    for name in names:
        if name == "zoo_encoder_layer":
            from compiler.frontend.models import get_model
            from compiler.frontend.onnx_export import export_onnx

            model = export_onnx(get_model("encoder_layer"), 17)
        else:
            model = NETS[name][1]()
        model.graph.name = name
        paths[name] = workdir / f"{name}.onnx"
        onnx.save(model, paths[name])
    return paths


def cpu_detail() -> str:
    """Family/model and SIMD level from /proc/cpuinfo (the model name alone may say just 'AMD EPYC')."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    family, model = info.get("cpu family", "?"), info.get("model", "?")
    zen = {"25": {"17": "Zen 4", "160": "Zen 4c", "1": "Zen 3"}}.get(family, {}).get(model)
    simd = "AVX-512" if "avx512f" in info.get("flags", "").split() else "AVX2"
    return ", ".join(x for x in (f"family {family} model {model}", zen, simd) if x)


def tune(name: str, path: Path, url: str, trials: int, extra: list[str], log: Path, quiet: float) -> float:
    """``kiln tune`` one net into the database (once the machine is quiet); returns the wall time (its
    output goes to ``log``). Tuning measures kernels, so a loaded machine spoils its records too."""
    wait_quiet(quiet, 300)
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--model", str(path), "--trials", str(trials)]
    cmd += ["--db", url, "--no-summary", *extra]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"kiln tune failed on {name} (exit {proc.returncode}); see {log}")
    print(f"tuned {name}: {trials} trials in {seconds:.0f} s (log {log})", flush=True)
    return seconds


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got.astype(np.float64) - ref).max() / max(1.0, float(np.abs(ref).max())))


def check(name: str, who: str, outs: list[np.ndarray], refs: list[np.ndarray], tol: float) -> float:
    worst = max(rel_err(o, r) for o, r in zip(outs, refs))
    if len(outs) != len(refs) or not worst <= tol:
        raise SystemExit(f"{who} computes {name} wrong: max|err| / max(1, max|ref|) = {worst:.2e} > {tol}")
    return worst


def background_busy(seconds: float = 0.5) -> float:
    """Fraction of this machine's CPU time used by other processes over ``seconds`` (we sleep meanwhile)."""

    def snapshot() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    total0, idle0 = snapshot()
    time.sleep(seconds)
    total1, idle1 = snapshot()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_quiet(threshold: float, max_wait: float) -> float:
    """Wait (up to ``max_wait`` s) until other processes use less than ``threshold`` of the CPUs; return
    the last measured background load."""
    deadline = time.monotonic() + max_wait
    busy = background_busy()
    while busy > threshold and time.monotonic() < deadline:
        time.sleep(2.0)
        busy = background_busy()
    return busy


def rounds_of(
    contenders: dict[str, Callable[[], object]], rounds: int, min_time: float, quiet: float, max_wait: float
) -> tuple[dict[str, list[float]], list[float]]:
    """{name: [round medians (us)]} with the contenders interleaved and their order rotated every round;
    before each round, wait for the machine to be quiet. Also returns the background load per round."""
    names = list(contenders)
    per: dict[str, list[float]] = {k: [] for k in names}
    busy = []
    for r in range(rounds):
        busy.append(wait_quiet(quiet, max_wait))
        for k in names[r % len(names) :] + names[: r % len(names)]:
            per[k].append(time_fn(contenders[k], min_time, max_iters=10_000))
    return per, busy


def bench_net(name: str, path: Path, url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    import onnx

    from compiler.frontend.onnx import load_onnx
    from compiler.reference import run_reference
    from tests.compiler.frontend.onnx_util import random_feeds
    from tuner.api import compile as kiln_compile

    model = onnx.load(path)
    feeds = random_feeds(model, seed=0)
    sess = ort_session(path)
    graph = load_onnx(path)
    inputs = [feeds[v.name] for v in graph.inputs]
    refs = run_reference(graph, inputs)
    ort_out = sess.run(None, feeds)
    ort_err = check(name, "onnxruntime", ort_out, refs, 1e-3)  # its fused kernels round differently
    default = kiln_compile(graph, "cpu")
    check(name, "kiln default", default.run(inputs), ort_out, 1e-4)
    contenders: dict[str, Callable[[], object]] = {
        "onnxruntime": lambda: sess.run(None, feeds),
        "kiln default": lambda: default.run(inputs, copy=False),
    }
    row: dict[str, Any] = {"net": name, "kernels": len(default.kernels), "ort err": ort_err}
    if url:
        from db.database import TuningDatabase

        with TuningDatabase.open(url, create=False) as db:
            tuned = kiln_compile(graph, "cpu", db=db)
        check(name, "kiln tuned", tuned.run(inputs), ort_out, 1e-4)
        contenders["kiln tuned"] = lambda: tuned.run(inputs, copy=False)
        row["tuned kernels"] = sum(1 for k in tuned.kernels if k.extra.get("origin") == "record")
    row["samples"], row["busy"] = rounds_of(contenders, args.rounds, args.min_time, args.quiet, args.max_wait)
    row["times"] = {k: statistics.median(v) for k, v in row["samples"].items()}
    return row


def spread(samples: list[float]) -> str:
    """The round medians' range relative to their median, e.g. '±4%' (max - min over 2 median)."""
    med = statistics.median(samples)
    return f"±{50 * (max(samples) - min(samples)) / med:.0f}%"


def render(rows: list[dict], args: argparse.Namespace, tune_s: dict[str, float], loads: list) -> str:
    table = []
    for r in rows:
        t = r["times"]
        out = {
            "net": f"`{r['net']}`",
            "kernels": r["kernels"],
            "onnxruntime us": f"{t['onnxruntime']:,.0f}",
            "kiln default us": f"{t['kiln default']:,.0f}",
            "default vs ORT": f"{t['onnxruntime'] / t['kiln default']:.2f}x",
        }
        if "kiln tuned" in t:
            out["kiln tuned us"] = f"{t['kiln tuned']:,.0f}"
            out["tuned vs ORT"] = f"**{t['onnxruntime'] / t['kiln tuned']:.2f}x**"
            out["tuned vs default"] = f"{t['kiln default'] / t['kiln tuned']:.2f}x"
            out["tuned kernels"] = f"{r['tuned kernels']}/{r['kernels']}"
        out["round spread (ORT / default / tuned)"] = " / ".join(spread(v) for v in r["samples"].values())
        out["background load"] = f"{100 * statistics.median(r['busy']):.0f}%"
        table.append(out)
    cols = ["net", "kernels", "onnxruntime us", "kiln default us"]
    cols += ["kiln tuned us"] if args.db else []
    cols += ["default vs ORT"] + (["tuned vs ORT", "tuned vs default", "tuned kernels"] if args.db else [])
    cols += ["round spread (ORT / default / tuned)", "background load"]
    best = "kiln tuned" if args.db else "kiln default"
    misses = [
        f"`{r['net']}` {r['times']['onnxruntime'] / r['times'][best]:.2f}x"
        for r in rows
        if r["times"][best] > r["times"]["onnxruntime"]
    ]
    verdict = f"{best} >= 1.0x onnxruntime on {len(rows) - len(misses)} of {len(rows)} nets" + (
        f"; below: {', '.join(misses)}." if misses else "."
    )
    if tune_s:
        cmd = f"kiln tune --model NET.onnx --trials {args.trials} --db URL --no-summary"
        cmd = " ".join([cmd, *args.tune_args])
        per = ", ".join(f"{k} {v:.0f} s" for k, v in tune_s.items())
        tuned_note = (
            f"Tuned: `{cmd}` per net ({sum(tune_s.values()) / 60:.1f} min of tuning in all: {per}), then "
            f"`tuner.api.compile(graph, 'cpu', db=URL)`."
        )
    elif args.db:
        tuned_note = f"Tuned: the records already in `{args.db}` (no tuning in this run)."
    else:
        tuned_note = "No tuned column (`--no-tuned`)."
    nets = "\n".join(f"- `{r['net']}`: {SHAPES[r['net']]}" for r in rows)
    return (
        "# Kiln vs onnxruntime on ONNX files (CPU)\n\n"
        f"Machine: {machine_line()} ({cpu_detail()}). Measured with `python scripts/bench_onnx.py "
        f"{' '.join(sys.argv[1:])}`.\n\n"
        f"Each net is an ONNX file; onnxruntime runs the file (CPU provider, ORT_ENABLE_ALL, sequential, "
        f"{THREADS} intra-op threads); Kiln imports it with `load_onnx` and compiles it for the CPU "
        f"({THREADS} OpenMP threads). Outputs checked first (onnxruntime vs the numpy reference, Kiln vs "
        f"onnxruntime, max|err| <= 1e-4 * max(1, max|ref|)). Latency in microseconds: median of "
        f"{args.rounds} interleaved rounds (order rotated per round), each round the median of runs "
        f"filling {args.min_time} s. Ratios are onnxruntime time / Kiln time (above 1: Kiln is faster). "
        f"onnxruntime allocates its outputs per call, Kiln reuses its output buffers.\n\n"
        f"{tuned_note}\n\n"
        f"Noise: other engineers' jobs share this machine (load average {loads[0]:.2f} before timing, "
        f"{loads[1]:.2f} after, on {THREADS} cores). Before each round the script waits (up to "
        f"{args.max_wait:.0f} s) until other processes use less than {100 * args.quiet:.0f}% of the CPUs; "
        f"'background load' is the median of what it measured just before the rounds, 'round spread' "
        f"the range of the round medians (half of max - min, relative to the median).\n"
        f"\n{markdown_table(table, cols)}\n\n{verdict}\n\nNets (float32):\n\n{nets}\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", nargs="*", default=NET_ORDER, choices=NET_ORDER)
    ap.add_argument("--trials", type=int, default=150, help="kiln tune trials per net (0: no tuning)")
    ap.add_argument(
        "--db",
        default=None,
        help="tuning database URL (default: sqlite:///WORKDIR/bench_onnx.db; tuned records go here)",
    )
    ap.add_argument("--no-tuned", action="store_true", help="time onnxruntime and Kiln default only")
    ap.add_argument("--tune-args", nargs=argparse.REMAINDER, default=[], help="more `kiln tune` arguments")
    ap.add_argument("--workdir", help="where the ONNX files, tuning logs and database go (default: temp)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per contender per round")
    ap.add_argument(
        "--quiet",
        type=float,
        default=0.25,
        help="before each round wait until other processes use less than this fraction of the CPUs",
    )
    ap.add_argument("--max-wait", type=float, default=120.0, help="longest wait for quiet per round (s)")
    ap.add_argument("--out", help="write the markdown report here")
    args = ap.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kiln-bench-onnx-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.no_tuned:
        args.db, args.trials = None, 0
    elif args.db is None:
        args.db = f"sqlite:///{workdir / 'bench_onnx.db'}"
    paths = write_nets(args.nets, workdir)
    tune_s: dict[str, float] = {}
    if args.db and args.trials > 0:
        for name, path in paths.items():
            log = workdir / f"tune_{name}.log"
            tune_s[name] = tune(name, path, args.db, args.trials, args.tune_args, log, args.quiet)
    loads = [os.getloadavg()[0]]
    rows = []
    for name, path in paths.items():
        row = bench_net(name, path, args.db, args)
        t = row["times"]
        print(
            f"{name}: "
            + ", ".join(f"{k} {v:,.0f} us" for k, v in t.items())
            + "".join(
                f", {k} vs ORT {t['onnxruntime'] / v:.2f}x" for k, v in t.items() if k != "onnxruntime"
            ),
            flush=True,
        )
        rows.append(row)
    loads.append(os.getloadavg()[0])
    text = render(rows, args, tune_s, loads)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
