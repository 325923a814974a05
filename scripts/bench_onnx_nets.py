#!/usr/bin/env python
"""Kiln vs onnxruntime on ONNX nets exported from PyTorch (CPU, same thread count for both).

The nets (``tests/compiler/frontend/torch_nets.py``, benchmark sizes): an MNIST MLP, a conv net with
BatchNorm and pooling, a ResNet basic block (64 channels, 28x28), a MobileNetV2 inverted residual with a
depthwise 3x3 convolution, a transformer encoder layer, a GPT block, RMSNorm + SwiGLU and an MLP-Mixer
layer. Each is exported with ``torch.onnx.export`` (TorchScript exporter, opset 17) into the work
directory at run time (no ONNX file is committed; the conv nets keep their BatchNormalization nodes, so
both runtimes fold them), then:

1. tuned (unless ``--trials-per-task 0``): ``kiln tune --model NET.onnx --trials-per-task N --db URL`` per
   net, a subprocess, before any timing; the trials measured per net are counted from the database;
2. loaded three ways: onnxruntime on the file (CPU provider, ORT_ENABLE_ALL, sequential,
   ``intra_op_num_threads`` = this machine's cores), Kiln default schedules, Kiln with the database's best
   records (``tuner.api.compile(graph, "cpu", db=...)``), all with the same number of threads;
3. checked: onnxruntime against torch, both Kiln models against onnxruntime
   (max|err| <= 1e-4 * max(1, max|ref|));
4. timed in one process, interleaved, the order rotated every round (``scripts/bench_onnx.py``'s rounds):
   the table gives the median of the round medians and their spread.

``KILN_HOST_ISA=avx2`` makes Kiln generate AVX2 code on an AVX-512 host (emulated AVX2: the hardware
still has AVX-512, onnxruntime still uses it); the target key differs, so the records do too.

    python scripts/bench_onnx_nets.py --trials-per-task 0 --out benchmarks/onnx_nets.md
    python scripts/bench_onnx_nets.py --nets conv_net resnet_block --trials-per-task 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_common import THREADS, machine_line, markdown_table  # noqa: E402
from scripts.bench_onnx import check, cpu_detail, ort_session, rounds_of, spread  # noqa: E402

NET_ORDER = [
    "mnist_mlp",
    "conv_net",
    "resnet_block",
    "mobilenetv2_block",
    "encoder_layer",
    "gpt_block",
    "rmsnorm_swiglu",
    "mlp_mixer",
]


def export_nets(names: list[str], workdir: Path) -> dict[str, tuple[Path, np.ndarray, np.ndarray]]:
    """{name: (ONNX file, input, torch output)} for each net, exported into ``workdir``."""
    import onnx
    import torch

    from tests.compiler.frontend.torch_nets import CONV_NETS, NETS, export

    out = {}
    for name in names:
        module, x = NETS[name][1]("bench")
        model = export(module, x, keep_batchnorm=name in CONV_NETS)
        model.graph.name = name
        path = workdir / f"{name}.onnx"
        onnx.save(model, path)
        with torch.no_grad():
            ref = module(x).numpy()
        out[name] = (path, x.numpy(), ref)
    return out


def tune(name: str, path: Path, url: str, per_task: int, log: Path) -> float:
    """``kiln tune`` one net into the database; returns the wall time (output goes to ``log``)."""
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "tune",
        "--model",
        str(path),
        "--trials-per-task",
        str(per_task),
    ]
    cmd += ["--db", url, "--no-summary"]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"kiln tune failed on {name} (exit {proc.returncode}); see {log}")
    print(f"tuned {name}: {per_task} trials per task in {seconds:.0f} s (log {log})", flush=True)
    return seconds


def trials_in_db(graph: Any, url: str) -> tuple[int, int]:
    """(records measured for this net's workloads on this host's target, number of tasks), from the db."""
    from compiler.target import Target
    from db.database import TuningDatabase
    from tuner.task import extract_tasks

    target = Target.host()
    keys = [t.group.workload_key for t in extract_tasks(graph, target)]
    with TuningDatabase.open(url, create=False) as db:
        count = sum(len(db.find_records(k, target.key)) for k in keys)
    return int(count), len(keys)


def bench_net(name: str, path: Path, x: np.ndarray, ref: np.ndarray, url: str | None, args) -> dict:
    from compiler.frontend.onnx import load_onnx
    from tuner.api import compile as kiln_compile

    sess = ort_session(path)
    graph = load_onnx(path)
    feeds = {sess.get_inputs()[0].name: x}
    ort_out = sess.run(None, feeds)
    ort_err = check(name, "onnxruntime", ort_out, [ref], 1e-3)
    default = kiln_compile(graph, "cpu")
    check(name, "kiln default", default.run([x]), ort_out, 1e-4)
    contenders = {
        "onnxruntime": lambda: sess.run(None, feeds),
        "kiln default": lambda: default.run([x], copy=False),
    }
    row: dict[str, Any] = {"net": name, "kernels": len(default.kernels), "ort err": ort_err}
    if url:
        from db.database import TuningDatabase

        with TuningDatabase.open(url, create=False) as db:
            tuned = kiln_compile(graph, "cpu", db=db)
        check(name, "kiln tuned", tuned.run([x]), ort_out, 1e-4)
        contenders["kiln tuned"] = lambda: tuned.run([x], copy=False)
        row["tuned kernels"] = sum(1 for k in tuned.kernels if k.extra.get("origin") == "record")
        row["trials"], row["tasks"] = trials_in_db(graph, url)
    row["samples"], row["busy"] = rounds_of(contenders, args.rounds, args.min_time, args.quiet, args.max_wait)
    row["times"] = {k: statistics.median(v) for k, v in row["samples"].items()}
    return row


def render(rows: list[dict], args: argparse.Namespace, tune_s: dict[str, float], loads: list[float]) -> str:
    from tests.compiler.frontend.torch_nets import NETS

    tuned = any("kiln tuned" in r["times"] for r in rows)
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
        if tuned:
            out["kiln tuned us"] = f"{t['kiln tuned']:,.0f}"
            out["tuned vs ORT"] = f"**{t['onnxruntime'] / t['kiln tuned']:.2f}x**"
            out["trials (db) / tasks"] = f"{r['trials']} / {r['tasks']}"
            out["tuned kernels"] = f"{r['tuned kernels']}/{r['kernels']}"
        out["round spread (" + " / ".join(r["samples"]) + ")"] = " / ".join(
            spread(v) for v in r["samples"].values()
        )
        out["background load"] = f"{100 * statistics.median(r['busy']):.0f}%"
        table.append(out)
    cols = list(table[0])
    best = "kiln tuned" if tuned else "kiln default"
    misses = [
        f"`{r['net']}` {r['times']['onnxruntime'] / r['times'][best]:.2f}x"
        for r in rows
        if r["times"][best] > r["times"]["onnxruntime"]
    ]
    verdict = f"{best} >= 1.0x onnxruntime on {len(rows) - len(misses)} of {len(rows)} nets" + (
        f"; below: {', '.join(misses)}." if misses else "."
    )
    isa = os.environ.get("KILN_HOST_ISA")
    isa_note = (
        f"Kiln code generated for `KILN_HOST_ISA={isa}` (emulated: compiled with that ISA's flags and "
        "vector width on this host; onnxruntime uses the host's full ISA)."
        if isa
        else "Kiln code generated for the host's native ISA."
    )
    if tune_s:
        per = ", ".join(f"{k} {v:.0f} s" for k, v in tune_s.items())
        tuned_note = (
            f"Tuned: `kiln tune --model NET.onnx --trials-per-task {args.trials_per_task} --db URL` per net "
            f"({sum(tune_s.values()) / 60:.1f} min in all: {per}); the trials column counts the records in "
            "the database for the net's workloads on this target (all statuses)."
        )
    elif tuned:
        tuned_note = f"Tuned: the records already in `{args.db}` (no tuning in this run)."
    else:
        tuned_note = "Default schedules only (no tuning in this run)."
    nets = "\n".join(f"- `{r['net']}`: {NETS[r['net']][0]}" for r in rows)
    return (
        "# Kiln vs onnxruntime on ONNX nets exported from PyTorch (CPU)\n\n"
        f"Machine: {machine_line()} ({cpu_detail()}). Produced by `"
        f"{_pinning()}{'KILN_HOST_ISA=' + isa + ' ' if isa else ''}python scripts/bench_onnx_nets.py "
        f"{' '.join(sys.argv[1:])}`.\n\n"
        f"{isa_note} Each net is exported with `torch.onnx.export` (opset 17) at run time; onnxruntime "
        f"runs the file (CPU provider, ORT_ENABLE_ALL, sequential, {THREADS} intra-op threads); Kiln "
        f"imports it with `load_onnx` and runs it with {THREADS} OpenMP threads. Outputs checked first "
        "(onnxruntime vs torch, Kiln vs onnxruntime). Latency in microseconds: median of "
        f"{args.rounds} interleaved rounds (order rotated per round), each round the median of runs filling "
        f"{args.min_time} s. Ratios are onnxruntime time / Kiln time (above 1: Kiln is faster). "
        "onnxruntime allocates its outputs per call, Kiln reuses its output buffers.\n\n"
        f"{tuned_note}\n\n"
        f"Noise: other engineers' jobs share this machine (load average {loads[0]:.2f} before timing, "
        f"{loads[1]:.2f} after, on {THREADS} cores); the ratios come from this one interleaved run. "
        "'round spread' is half the range of the round medians relative to their median; 'background "
        "load' the median share of the CPUs other processes used just before each round.\n\n"
        f"{markdown_table(table, cols)}\n\n{verdict}\n\nNets (float32, batch as shown):\n\n{nets}\n"
    )


def _pinning() -> str:
    """``taskset -c CPUS `` when this process runs on fewer CPUs than the machine has (a pinned run)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= (os.cpu_count() or len(cpus)):
        return ""
    return f"taskset -c {','.join(map(str, cpus))} "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", nargs="*", default=NET_ORDER, choices=NET_ORDER)
    ap.add_argument("--trials-per-task", type=int, default=100, help="kiln tune trials per task (0: none)")
    ap.add_argument("--db", default=None, help="tuning database URL (default: WORKDIR/bench_onnx_nets.db)")
    ap.add_argument("--no-tuned", action="store_true", help="time onnxruntime and Kiln default only")
    ap.add_argument("--workdir", help="where the ONNX files, tuning logs and database go (default: temp)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per contender per round")
    ap.add_argument("--quiet", type=float, default=0.25, help="wait for other processes below this share")
    ap.add_argument("--max-wait", type=float, default=20.0, help="longest wait for quiet per round (s)")
    ap.add_argument("--out", help="write the markdown report here")
    args = ap.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kiln-bench-onnx-nets-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.no_tuned:
        args.db, args.trials_per_task = None, 0
    elif args.db is None:
        args.db = f"sqlite:///{workdir / 'bench_onnx_nets.db'}"
    nets = export_nets(args.nets, workdir)
    tune_s: dict[str, float] = {}
    if args.db and args.trials_per_task > 0:
        for name, (path, _x, _ref) in nets.items():
            tune_s[name] = tune(name, path, args.db, args.trials_per_task, workdir / f"tune_{name}.log")
    elif args.db and not Path(args.db.removeprefix("sqlite:///")).exists():
        args.db = None  # nothing tuned and no database: default schedules only
    loads = [os.getloadavg()[0]]
    rows = []
    for name, (path, x, ref) in nets.items():
        row = bench_net(name, path, x, ref, args.db, args)
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
