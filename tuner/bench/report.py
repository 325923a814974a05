"""A bench run as text and pictures: the markdown report (``--out``), the comparison table of two runs, and
matplotlib charts (``--plot``: bars of each contender relative to Kiln per workload; ``--history``: each
workload's medians over the stored runs of its suite).

Kiln's figure in the "vs" columns is its fastest tuned contender where one ran, else its fastest default one.
Rates: a workload whose contractions do more than 10 FLOPs per byte of inputs, params and outputs is quoted
in GFLOP/s against the run's SGEMM; the rest in GB/s against the copy bandwidth measured at that workload's
own working set with the same threads (cache-resident where the set fits in the caches).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.bench.environment import describe
from tuner.bench.results import OK, BenchRun
from tuner.bench.runner import COMPUTE_BOUND
from tuner.bench.stats import Verdict

KILN_TUNED = ("kiln tuned", "kiln tuned graph")
KILN_DEFAULT = ("kiln default", "kiln", "kiln graph")


def kiln_figure(run: BenchRun, workload: str) -> tuple[str, float] | None:
    """Kiln's figure for the vs columns: its fastest tuned contender where one ran, else its fastest
    default one, as (contender, median us)."""
    for group in (KILN_TUNED, KILN_DEFAULT):
        timed = [
            (r.contender, r.median_us)
            for name in group
            if (r := run.result(workload, name)) is not None and r.status == OK and r.median_us is not None
        ]
        if timed:
            return min(timed, key=lambda t: t[1])
    return None


def _table(rows: list[list[str]], head: list[str], right_from: int = 1) -> str:
    lines = ["| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join("---:" if i >= right_from else "---" for i in range(len(head))) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _fmt_us(us: float) -> str:
    return f"{us:,.0f}" if us >= 100 else f"{us:,.1f}"


def results_table(run: BenchRun) -> str:
    """The per-workload table: each contender's median (± half the IQR of the round medians), Kiln vs the
    best peer, Kiln's rate against the matching ceiling."""
    contenders = [c for c in run.contenders if any(r.status == OK for r in run.results if r.contender == c)]
    head = ["workload", *[f"{c} us" for c in contenders], "kiln vs best peer", "kiln rate", "of ceiling"]
    rows = []
    sgemm = run.ceilings.get("sgemm_gflops")
    for w in run.workloads:
        row = [f"`{w}`"]
        for c in contenders:
            r = run.result(w, c)
            s = r.summary if r is not None and r.status == OK else None
            row.append(f"{_fmt_us(s.median)} ±{100 * s.spread:.0f}%" if s else (r.status if r else "-"))
        kiln = kiln_figure(run, w)
        peers = {
            r.contender: r.median_us
            for r in run.results
            if r.workload == w and r.status == OK and r.median_us and not r.contender.startswith("kiln")
        }
        if kiln and peers:
            best = min(peers, key=peers.__getitem__)
            row.append(f"{peers[best] / kiln[1]:.2f}x ({best})")
        else:
            row.append("-")
        any_r = next(r for r in run.results if r.workload == w)
        contraction = float(any_r.info.get("contraction_flops", 0.0))
        if kiln and any_r.bytes and contraction / any_r.bytes > COMPUTE_BOUND:
            rate = any_r.flops / (kiln[1] * 1e-6) / 1e9
            same = any_r.info.get("sgemm_gflops_same_rounds") or sgemm
            row += [f"{rate:,.0f} GFLOP/s", f"{rate / same:.0%} of numpy SGEMM" if same else "-"]
        elif kiln and any_r.bytes:
            rate = any_r.bytes / (kiln[1] * 1e-6) / 1e9
            # the copy at the workload's own set (CPU), else the device's copy (GPU)
            copy = any_r.info.get("copy_gbs_same_set") or run.ceilings.get("copy_dram_gbs")
            row += [f"{rate:,.1f} GB/s", f"{rate / copy:.0%} of copy ({_mib(any_r.bytes)})" if copy else "-"]
        else:
            row += ["-", "-"]
        rows.append(row)
    return _table(rows, head)


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB set" if nbytes < (1 << 30) else f"{nbytes / (1 << 30):.1f} GiB set"


def tuning_table(run: BenchRun) -> str | None:
    rows = run.settings.get("tuning")
    if not rows:
        return None
    body = [
        [f"`{r['workload']}`", str(r["runs"]), str(r["measured"]), str(r["ok"]), f"{r['seconds']:.0f}",
         f"{r['measured'] / r['seconds']:.1f}" if r["seconds"] else "-"]
        for r in rows
    ]  # fmt: skip
    return _table(body, ["workload", "tuning runs", "measured trials", "ok", "tuning s", "trials/s"])


def markdown(run: BenchRun, command: str | None = None) -> str:
    """The whole report of one run."""
    env = run.environment
    s = run.settings
    libs = ", ".join(f"{k} {v}" for k, v in env.get("libraries", {}).items() if v)
    date = run.started_at.strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# kiln bench: suite `{run.suite}` on `{run.target_key}`", ""]
    lines.append(
        f"Command: `{command or 'kiln ' + run.command_line}`"
        + (f" (stored as run {run.id})" if run.id else "")
    )
    lines.append("")
    lines.append(
        f"Machine: {describe(env)}; {date}. Kiln {env.get('kiln_version')} "
        f"(git {env.get('git_commit') or 'unknown'}); Python {env.get('python')}; {libs}."
        + (
            " BLAS libraries loaded (threadpoolctl): "
            + ", ".join(
                f"{b.get('internal_api')} {b.get('version')} ({b.get('architecture')} kernels)"
                for b in env["blas"]
            )
            + "."
            if env.get("blas")
            else ""
        )
    )
    lb, la = run.load_before, run.load_after
    if lb is not None:
        lines.append("")
        lines.append(
            f"Load average {lb:.2f} before and {la:.2f} after the run on {env.get('cpu', {}).get('threads')} "
            "cores: the machine is shared with other engineers' jobs, so absolute times are noisy; compare "
            "ratios within this run."
        )
    others = {}
    for r in run.results:
        if r.info.get("others_cpu") is not None:
            others.setdefault(r.workload, r.info["others_cpu"])
    if others:
        lines.append("")
        lines.append(
            "CPU that other processes used while each workload's rounds ran (/proc/stat less this process, "
            "in cores' worth: 1.00 is one core kept busy by another job): "
            + ", ".join(f"`{w}` {v:.2f}" for w, v in others.items())
            + ". Where it is high, every contender of that workload ran slower than on a quiet machine."
        )
    c = run.ceilings
    if c and "copy_cache_gbs" not in c:  # a GPU run
        lines += [
            "",
            f"Ceilings measured in this run: device copy {c['copy_dram_gbs']:,.0f} GB/s (read + written), "
            f"cuBLAS SGEMM 4096^3 (TF32 off) {c['sgemm_gflops'] / 1e3:.1f} TFLOP/s.",
        ]
    elif c:
        cache_mib = c["copy_cache_set_bytes"] / (1 << 20)
        dram_mib = c["copy_dram_set_bytes"] / (1 << 20)
        lines += [
            "",
            f"Ceilings, all with {s.get('threads')} threads. Per workload, timed in the same interleaved "
            "rounds as the contenders (same load): the copy bandwidth at the workload's own working set "
            "(inputs + params + outputs; cache-resident where it fits, as for the contenders' repeated "
            "calls) "
            "and, for contraction-heavy workloads, numpy/BLAS SGEMM 1024^3; 'of ceiling' compares Kiln with "
            f"those. For reference, at the end of the run: copy {c['copy_cache_gbs']:.0f} GB/s at "
            f"{cache_mib:.0f} MiB (cache-resident), {c['copy_dram_gbs']:.0f} GB/s at {dram_mib:.0f} MiB "
            f"(DRAM), SGEMM {c['sgemm_gflops']:.0f} GFLOP/s (bytes read + written).",
        ]
    lines += [
        "",
        f"Method: every contender's outputs were checked against the numpy reference first (max|err| / "
        f"max(1, max|ref|) <= 1e-3); then all were timed in {s.get('rounds')} interleaved rounds, the order "
        f"rotated every round, each round {s.get('min_time')} s of back-to-back calls per contender "
        f"(OMP_WAIT_POLICY={s.get('omp_wait_policy')}: idle OpenMP threads, e.g. torch's, sleep). Figures "
        "are the median of the round medians in microseconds, ± half the interquartile range of the round "
        "medians. FLOPs and bytes come from the graph.",
    ]
    if s.get("slowdown"):
        lines += [
            "",
            f"**Test hook active: KILN_BENCH_SLOWDOWN {s['slowdown']} (figures slowed on purpose).**",
        ]
    lines += ["", results_table(run), ""]
    notes = {r.contender: r.note for r in run.results if r.note}
    lines.append("Contenders:")
    lines.append("")
    lines += [f"- `{k}`: {v}" for k, v in notes.items()]
    problems = sorted({(r.contender, r.status, r.error or "") for r in run.results if r.status != OK})
    if problems:
        lines += ["", "Not timed:", ""]
        seen_unavailable = set()
        for who, status, error in problems:
            if status == "unavailable":
                if who in seen_unavailable:
                    continue
                seen_unavailable.add(who)
                lines.append(f"- `{who}`: unavailable: {error}")
        for r in run.results:
            if r.status not in (OK, "unavailable"):
                lines.append(f"- `{r.contender}` on `{r.workload}`: {r.status}: {r.error}")
    tuned = [
        f"`{r.workload}` {r.info['kernels_from_records']}/{r.info['kernels']}"
        + (
            f" ({r.info['kernels_kept_default']} kept the default: their records were confirmed not faster)"
            if r.info.get("kernels_kept_default")
            else ""
        )
        for r in run.results
        if r.contender == "kiln tuned" and r.status == OK and "kernels" in r.info
    ]
    if tuned:
        lines += ["", "Kernels compiled from tuning records (kiln tuned): " + ", ".join(tuned) + "."]
    tt = tuning_table(run)
    if tt:
        lines += [
            "",
            "## Tuning (from the database)",
            "",
            "Measured trials are the records the tuning runs of each workload stored in the database on this "
            "target (not the requested budget); tuning seconds are the runs' wall time.",
            "",
            tt,
        ]
    return "\n".join(lines) + "\n"


def compare_table(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    """Rows for printing a comparison (``kiln bench compare``)."""
    return [
        {
            "workload": v.workload,
            "contender": v.contender,
            "baseline us": None if v.baseline_us is None else round(v.baseline_us, 1),
            "new us": None if v.new_us is None else round(v.new_us, 1),
            "ratio": None if v.ratio is None else round(v.ratio, 3),
            "95% interval": None if v.ci_low is None else f"{v.ci_low:.3f}-{v.ci_high:.3f}",
            "p": None if v.p_value is None else round(v.p_value, 4),
            "verdict": v.verdict,
            "why": v.reason,
        }
        for v in verdicts
    ]


# ------------------------------------------------------------------------------------------------ charts
def _pyplot():  # type: ignore[no-untyped-def]
    from compiler.errors import KilnError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KilnError('charts need matplotlib: pip install -e ".[plot]"') from None
    return plt


def bars_chart(run: BenchRun, path: Path) -> None:
    """Per workload, each peer's median relative to Kiln's (above 1: Kiln is faster), log scale."""
    import numpy as np

    plt = _pyplot()
    workloads = [w for w in run.workloads if kiln_figure(run, w)]
    contenders = [c for c in run.contenders if any(r.status == OK for r in run.results if r.contender == c)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(workloads) + 2), 4.2))
    width = 0.8 / max(1, len(contenders))
    x = np.arange(len(workloads))
    for i, c in enumerate(contenders):
        vals = []
        for w in workloads:
            r = run.result(w, c)
            k = kiln_figure(run, w)
            vals.append(r.median_us / k[1] if r and r.status == OK and r.median_us and k else np.nan)
        ax.bar(x + (i - (len(contenders) - 1) / 2) * width, vals, width, label=c)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(x, workloads, rotation=20, ha="right")
    ax.set_ylabel("latency / Kiln's latency (above 1: Kiln faster)")
    ax.set_title(f"kiln bench {run.suite} on {describe(run.environment)}", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def history_chart(runs: Sequence[BenchRun], path: Path) -> None:
    """Each workload's median per contender over the runs (x: run id), one panel per workload."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    workloads = list(dict.fromkeys(w for run in runs for w in run.workloads))
    contenders = list(dict.fromkeys(c for run in runs for c in run.contenders))
    cols = min(3, max(1, len(workloads)))
    rows = (len(workloads) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, w in zip(axes.flat, workloads):
        for c in contenders:
            pts = [(run.id, r.median_us) for run in runs if (r := run.result(w, c)) and r.median_us]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=c)
        ax.set_title(w, fontsize=9)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("bench run")
        ax.set_ylabel("median us")
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
