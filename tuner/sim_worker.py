"""One tuning worker with simulated measurement: ``python -m tuner.sim_worker --db URL --model NAME ...``.

It is :func:`tuner.api.tune` (the same run bookkeeping, leases and scheduling as ``kiln tune``) with a
:class:`~tuner.measure.sim.SimulatedRunner` instead of building and timing kernels: every config has a
fixed latency (derived from its canonical JSON) and each candidate keeps the worker busy ``--seconds``; a
fusion plan's whole model costs the sum of its kernels' fixed latencies (:class:`KernelCostTimer`).
The tests of several workers and ``scripts/bench_distributed.py`` start it as separate processes. It
prints the summary as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib

from compiler.frontend import load_model
from tuner.api import tune
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.plan_whole import KernelCostTimer
from tuner.scheduler import Budget
from tuner.space import config_json


def fixed_latency(task, config) -> float:  # type: ignore[no-untyped-def]
    """A latency that depends only on the config (10-19.6 us), the same in every worker."""
    return 10.0 + zlib.crc32(config_json(config).encode()) % 97 / 10


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.sim_worker", description=__doc__)
    p.add_argument("--db", required=True)
    p.add_argument("--model", default="encoder_layer")
    p.add_argument("--trials-per-task", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seconds", type=float, default=0.1, help="wall time of one simulated measurement")
    p.add_argument("--sampler", default="tpe")
    p.add_argument(
        "--start-at", type=float, default=None, help="wait until this time (epoch seconds) after loading"
    )
    args = p.parse_args(argv)
    graph = load_model(args.model)
    measurer = Measurer(SimulatedBuilder(), SimulatedRunner(fixed_latency, seconds=args.seconds))
    if args.start_at is not None:  # several workers start tuning together, their imports done
        time.sleep(max(0.0, args.start_at - time.time()))
    summary = tune(
        graph,
        "cpu",
        args.db,
        Budget(trials_per_task=args.trials_per_task),
        batch=args.batch,
        early_stop=None,
        sampler=args.sampler,
        measurer=measurer,
        time_model=False,
        # a fusion plan's whole model costs its kernels' simulated latencies (compiled, never timed)
        whole_timer=KernelCostTimer(lambda kernel: fixed_latency(None, kernel.config)),
    )
    print(json.dumps({"run_id": summary.run_id, "measured": summary.measured, "stored": summary.stored}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
