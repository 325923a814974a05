"""The contraction default's M cache blocks on several threads, on GEMMs whose N fits one cache block (the
default then splits M across the threads): the rule before stop 34 (the block counts whose block divides M,
however small, then the fewest rows on the busiest thread) against the current one (every block count up to
the L2 cap, the busiest thread's rows plus a cost per block, ``BLOCK_ROWS``) and every other ``mc_tiles``.
With ``--threads 1`` every shape is run (the rule does not apply there: old and new must agree).

    python scripts/bench_m_blocks.py --out benchmarks/m_blocks.md

Each workload is [M, K] x [K, N] float32 with Kiln's default schedule for this CPU, ``mc_tiles`` varied and
every other knob kept. Every config is built and run by Kiln's local measurer, which checks the output
against the numpy reference before timing. Rounds are interleaved, the order rotated each round; each cell is
the median over rounds of the runner's median (rounds' min-max). The development shapes are those the block
cost was read from; the validation shapes were fixed before the rule was run on them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import gmean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.backends.cpu.sketches import contraction
from compiler.target import Target
from db.status import Status
from scripts.bench_common import cpu_name, emit_report, git_commit
from scripts.bench_edge_tiles import gemm_task
from tuner.measure import MeasureInput, Measurer

DEVELOPMENT = (
    "1026x512x512,1024x512x512,256x512x512,100x512x512,2000x1024x256,"
    # the first validation set: the rule of the block cost alone was run on it, and what it showed (a cap
    # that preferred a small block dividing M) changed the rule, so it is development data now
    "500x256x512,3000x512x128,130x1024x256,777x384x384,64x512x512,1500x256x256,4100x128x64,333x512x256"
)
VALIDATION = (
    "1200x512x256,700x256x512,2500x384x128,90x2048x128,5000x64x64,450x1024x128,1800x512x512,610x768x256"
)
MC_VALUES = (1, 2, 4, 8, 16, 32)


def fewest_rows(cap: int, extent: int, tile: int, batch: int, cores: int) -> int:
    """The rule before stop 34: the busiest thread's rows alone (no cost per block)."""

    def busiest(t: int) -> int:
        blocks = batch * -(-extent // (tile * t))
        return -(-blocks // cores) * tile * t

    values = [t for t in MC_VALUES if t <= cap] or [1]
    return min(values, key=lambda t: (busiest(t), -t))


def old_rule(cap: int, extent: int, tile: int, batch: int, cores: int) -> int:
    """The M blocks on several threads before stop 34: the cap lowered to a block dividing M, however small
    (``_tiles_within``, which one thread still uses), then the fewest rows."""
    return fewest_rows(contraction._tiles_within(cap, extent, tile), extent, tile, batch, cores)


def old_default(task) -> dict:
    current = contraction._balanced_tiles
    contraction._balanced_tiles = old_rule
    try:
        return task.default()
    finally:
        contraction._balanced_tiles = current


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for s in filter(None, text.split(",")):
        try:
            m, k, n = (int(x) for x in s.split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {s!r} is not MxKxN") from None
        out.append((m, k, n))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--development", default=DEVELOPMENT, help="MxKxN shapes the block cost was read from")
    p.add_argument("--validation", default=VALIDATION, help="MxKxN shapes fixed before the rule ran on them")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="write the markdown table here too")
    args = p.parse_args(argv)
    if args.threads < 1:
        raise SystemExit(f"--threads: {args.threads} is not a thread count")
    target = dataclasses.replace(Target.host(), cores=args.threads)
    sets = {"development": parse_shapes(args.development), "validation": parse_shapes(args.validation)}
    cases = []  # (set, shape, task, old mc, new mc, {mc: index into inputs})
    inputs: list[MeasureInput] = []
    for name, shapes in sets.items():
        for shape in shapes:
            task = gemm_task(*shape, target)
            new, old = task.default(), old_default(task)
            if args.threads > 1 and new["parallel"] != "batch_m":
                print(f"{shape}: the default splits {new['parallel']}, not M; skipped", flush=True)
                continue
            idx = {}
            for mc in MC_VALUES:
                cfg = dict(new, mc_tiles=mc)
                try:
                    task.check(cfg)
                except Exception:
                    continue
                idx[mc] = len(inputs)
                inputs.append(MeasureInput(task, cfg))
            cases.append((name, shape, task, old["mc_tiles"], new["mc_tiles"], idx))
    measurer = Measurer("local", "local", target, {}, {"num_threads": args.threads})
    lat: dict[int, list[float]] = {}
    try:
        for r in range(args.rounds):
            shift = r * len(inputs) // args.rounds
            order = list(range(shift, len(inputs))) + list(range(shift))
            for i, res in zip(order, measurer.measure([inputs[i] for i in order])):
                if res.status != Status.OK:
                    raise SystemExit(f"{inputs[i].task.name} {inputs[i].config}: {res.status}: {res.error}")
                lat.setdefault(i, []).append(res.median_us)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        measurer.close()
    command = shlex.join(sys.argv[1:] if argv is None else argv)
    isa = os.environ.get("KILN_HOST_ISA")
    prefix = f"KILN_HOST_ISA={isa} " if isa else ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# The contraction default's M cache blocks on several threads",
        "",
        f"Generated by one command: `{prefix}python scripts/bench_m_blocks.py {command}` ({when}; git "
        f"{git_commit()[:12]}). Machine: {cpu_name()}, target `{target.key}`, {args.threads} threads. "
        "[M, K] x [K, N] float32, Kiln's default config with `mc_tiles` varied (every other knob the same); "
        f"outputs checked against numpy before timing; {args.rounds} rounds in rotated order; median over "
        "rounds of the runner's median (rounds' min-max). `old`: the rule before stop 34 (block counts "
        "whose block divides M first, however small; then the fewest rows on the busiest thread); `new`: "
        "every block count up to the L2 cap, the busiest thread's rows plus `BLOCK_ROWS` per block; "
        "`best`: the fastest `mc_tiles`.",
        "",
        "| set | M x K x N | mr | old mc_tiles | new mc_tiles | best mc_tiles | old us | new us | best us | "
        "old / new | new / best |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[str, list[tuple[float, float]]] = {}
    for name, shape, task, old, new, idx in cases:
        med = {mc: float(np.median(lat[i])) for mc, i in idx.items()}
        best = min(med, key=med.__getitem__)

        def cell(mc: int, idx=idx, med=med) -> str:
            x = np.asarray(lat[idx[mc]])
            return f"{med[mc]:.1f} ({x.min():.1f}-{x.max():.1f})"

        mr = task.default()["mr"]
        lines.append(
            f"| {name} | {'x'.join(map(str, shape))} | {mr} | {old} | {new} | {best} | {cell(old)} | "
            f"{cell(new)} | {cell(best)} | {med[old] / med[new]:.2f} | {med[new] / med[best]:.2f} |"
        )
        ratios.setdefault(name, []).append((med[old] / med[new], med[new] / med[best]))
    lines.append("")
    for name, rs in ratios.items():
        a, b = np.asarray(rs).T
        lines.append(
            f"- {name} ({len(rs)} shapes): geometric mean old / new **{gmean(a):.2f}** (range {a.min():.2f}-"
            f"{a.max():.2f}); new / best **{gmean(b):.2f}** (worst {b.max():.2f})"
        )
    emit_report(lines, args.out)


if __name__ == "__main__":
    main()
