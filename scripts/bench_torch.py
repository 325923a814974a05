#!/usr/bin/env python
"""torch.compile benchmark: PyTorch eager vs ``torch.compile`` (inductor) vs ``torch.compile(backend="kiln")``
with tuned records, on the CPU, for five torch.nn modules (MLP, conv net with BatchNorm in eval mode,
``nn.TransformerEncoderLayer``, GPT-style block with causal SDPA, RMSNorm + SwiGLU).

1. tuned: ``tuner.torch_backend.tune_module(module, [x], db, trials)`` per module (skipped with
   ``--trials 0``: the records already in ``--db`` are used);
2. compiled: inductor (``torch.compile(m)``) and Kiln (``backend="kiln"``, ``options={"db": ...}``), both
   with ``dynamic=False``; every contender runs the same module on the same input under ``no_grad``;
3. checked: inductor and Kiln against eager (max|err| <= 1e-4 * max(1, max|ref|)) before any timing;
4. timed in one process, interleaved: every round times each contender (in a rotating order) for
   ``--min-time`` seconds and keeps its median; the table gives the median of the round medians and the
   spread (min-max) of the round medians.

Two OpenMP runtimes share the cores (torch's and the libgomp Kiln's kernels link); how idle threads wait
(``OMP_WAIT_POLICY``, read when each runtime starts) changes every contender's figures, so the table names
it. The script sets ACTIVE unless the environment says otherwise: on this 2-core machine, with the variable
unset every contender's medians became whole multiples of the scheduler's 4 ms slice (threads of the two
runtimes taking the cores from each other), and PASSIVE made eager and inductor about 2x slower than ACTIVE.

    python scripts/bench_torch.py --out benchmarks/torch.md --trials 32
    python scripts/bench_torch.py --trials 0 --db sqlite:///bench_torch.db --modules mlp gpt_block
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # before torch and Kiln start their OpenMP runtimes

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_common import THREADS, machine_line, markdown_table, time_fn  # noqa: E402
from tests.tuner.torch_models import GPTBlock, SwiGLU  # noqa: E402
from tuner.scheduler import Budget  # noqa: E402
from tuner.torch_backend import kiln_backend, tune_module  # noqa: E402


def conv_net() -> nn.Module:
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    gen = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return net


MODULES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (lambda: nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)), (32, 256)),
    "conv_bn": (conv_net, (1, 3, 32, 32)),
    "encoder": (lambda: nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0), (32, 1, 128)),
    "gpt_block": (lambda: GPTBlock(128, 4), (1, 32, 128)),
    "rmsnorm_swiglu": (lambda: SwiGLU(128, 384), (1, 32, 128)),
}


class FallbackLog(logging.Handler):
    """Collects the kiln backend's fallback lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max())


def bench_module(
    name: str, db: str, budget: Budget | None, rounds: int, min_time: float, log: FallbackLog
) -> dict:
    torch.manual_seed(0)
    make, shape = MODULES[name]
    module = make().eval()
    x = torch.randn(*shape)
    row: dict = {"module": name, "input": "x".join(map(str, shape))}
    t0 = time.perf_counter()
    if budget is not None:
        summaries = tune_module(module, [x], db, budget=budget)
        row["tasks"] = sum(len(s.tasks) for s in summaries)
    row["tune_s"] = f"{time.perf_counter() - t0:.0f}"
    torch._dynamo.reset()
    models: list = []

    def on_model(graph: object, model: object) -> None:
        models.append(model)

    def kiln(gm: torch.fx.GraphModule, example_inputs: list, **kw: object) -> Callable:
        return kiln_backend(gm, example_inputs, on_model=on_model, **kw)

    log.lines.clear()
    with torch.no_grad():
        want = module(x)
        inductor = torch.compile(module, dynamic=False)
        kiln_fn = torch.compile(module, backend=kiln, dynamic=False, options={"db": db})
        contenders = {
            "eager": lambda: module(x),
            "inductor": lambda: inductor(x),
            "kiln": lambda: kiln_fn(x),
        }
        tol = 1e-4 * max(1.0, float(want.abs().max()))
        for who in ("inductor", "kiln"):
            err = max_err(contenders[who](), want)
            row[f"{who}_err"] = f"{err:.1e}"
            if err > tol:
                raise SystemExit(f"{name}: {who} differs from eager by {err:.3g} (> {tol:.3g})")
        per: dict[str, list[float]] = {k: [] for k in contenders}
        order = list(contenders)
        for r in range(rounds):
            for who in order[r % len(order) :] + order[: r % len(order)]:
                per[who].append(time_fn(contenders[who], min_time))
    kernels = [k for m in models for k in m.kernels]
    row["records"] = f"{sum(k.extra.get('origin') == 'record' for k in kernels)}/{len(kernels)}"
    row["fallback"] = "; ".join(log.lines) or "none"
    for who, samples in per.items():
        med = statistics.median(samples)
        row[f"{who}_us"] = f"{med:.1f} ({min(samples):.1f}-{max(samples):.1f})"
        row[f"_{who}"] = med
    row["kiln/inductor"] = f"{row['_inductor'] / row['_kiln']:.2f}x"
    row["kiln/eager"] = f"{row['_eager'] / row['_kiln']:.2f}x"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="sqlite:///bench_torch.db")
    ap.add_argument("--trials", type=int, default=32, help="tuning trials per module (0: use the db as is)")
    ap.add_argument("--trials-per-task", type=int, help="tuning trials per task instead of --trials")
    ap.add_argument("--modules", nargs="+", choices=list(MODULES), default=list(MODULES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    log = FallbackLog()
    logging.getLogger("kiln.torch").addHandler(log)
    if args.trials_per_task:
        budget = Budget(trials_per_task=args.trials_per_task)
        tuned = f"{args.trials_per_task} trials per task"
    elif args.trials:
        budget, tuned = Budget(trials=args.trials), f"{args.trials} trials per module (shared by its tasks)"
    else:
        budget, tuned = None, f"records already in {args.db}"
    rows = []
    for name in args.modules:
        rows.append(bench_module(name, args.db, budget, args.rounds, args.min_time, log))
        print(markdown_table(rows[-1:], [c for c in rows[-1] if not c.startswith("_")]), flush=True)
    columns = [
        "module", "input", "eager_us", "inductor_us", "kiln_us", "kiln/inductor", "kiln/eager",
        "records", "inductor_err", "kiln_err", "tune_s", "fallback",
    ]  # fmt: skip
    text = (
        f"# torch.compile on the CPU: eager vs inductor vs kiln (tuned)\n\n{machine_line()}; torch "
        f"{torch.__version__}, {THREADS} threads; tuning: {tuned}; median of {args.rounds} interleaved "
        "rounds (spread: min-max of the round medians), "
        "microseconds; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}.\n\n"
        f"{markdown_table(rows, columns)}\n\n`records`: Kiln kernels that use a tuned record / all kernels. "
        "`fallback`: what the kiln backend left to PyTorch eager.\n\n"
        f"    python scripts/bench_torch.py {' '.join(sys.argv[1:])}\n"
    )
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
