"""The cost model on a GPU (issue 18, item 4: "features for CUDA as they land"): measured CUDA data, and
whether the GBDT learned on it ranks held-out CUDA workloads better than the analytic prior.

    python scripts/bench_cost_model_cuda.py collect --db sqlite:///$OUT/cm_cuda.db      (on a GPU)
    python scripts/bench_cost_model_cuda.py heldout --db sqlite:///cm_cuda.db \\
        --report benchmarks/cost_model_cuda.md                                           (anywhere)

collect: the workloads are ``random_workload(k)`` of scripts/bench_cost_model.py for k = FIRST, FIRST+1, ...
(kinds in turn: pointwise, reduction, contraction; a range no CPU set uses), fixed here before anything of
them was measured. Each gets a TenSet pool: POOL distinct valid configs drawn uniformly from its whole CUDA
space (seed k) plus the sketch's default, built with NVRTC and checked and timed by Kiln's cuda ``local``
runner (CUDA events, L2 written over before each sample of a memory-bound kernel), and committed to the
tuning database as ordinary records. The registers per thread each build reported (cuFuncGetAttribute,
largest over the candidate's kernels) go to ``<db file>.regs.json`` beside it. Workloads are measured in
index order until ``--budget-s`` is spent, so a cut keeps whole pools and the kinds in turn.

heldout: the workloads with ``(k - FIRST) // 3 % 3 == 0`` (one of each kind in every nine: HELD_OUT) are
held out, by this rule fixed before measuring. The rest are the development set: leave-one-workload-out
cross-validation of each model there, then every model is trained on the whole development set and scores
each held-out workload's pool once. Metrics as TenSet's (cost_model/evaluate.py): top-k = best latency of
the pool / best latency among the model's k highest scores, weighted by workload (each pool counts once).
Features use the registers the build reported; the same is also shown with estimated registers (what
``kiln tune`` does today: it does not pass the build's count to the features).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.target import Target
from cost_model.dataset import Dataset, load_dataset, target_of
from cost_model.evaluate import EvalResult, cross_validate, train_and_score
from cost_model.features import FeatureExtractor
from cost_model.model import create_model
from db.database import RecordIn, TuningDatabase
from db.status import Status
from scripts.bench_common import cpu_name, git_commit
from scripts.bench_cost_model import get_task, higher, random_workload, uniform_pool, valid_configs
from tuner.space import config_json
from tuner.task import Task, extract_tasks

# random_workload indices from 7000 (the CPU sets use 0-23, 1000-1008, 2000-2089, 3000-3011, 4000.., 5000..)
FIRST = 7000
COUNT = 72  # at most; collect stops earlier when its budget is spent
POOL = 32  # uniform configs per workload (+ the default)
# the exhaustive sub-spaces (exhaust): random_workload indices from 8000, a range no other set uses
EXHAUST_FIRST = 8000
EXHAUST_PER_KIND = 4
EXHAUST_CHUNK = 96
MODELS = {"analytic prior": ("analytic", {}), "GBDT": ("gbdt", {})}


def held_out(k: int) -> bool:
    """The held-out rule, fixed before measuring: one workload of each kind in every nine."""
    return (k - FIRST) // 3 % 3 == 0


def workload_task(k: int, target: Target) -> Task:
    return extract_tasks(random_workload(k), target)[0]


# ------------------------------------------------------------------------------------------------ collect
def cuda_measurer(args: argparse.Namespace, target: Target):
    from tuner.measure import Measurer

    cupy = {"cupy_module": args.cupy_module} if args.cupy_module else {}
    return Measurer(
        "local",
        "local",
        target,
        {"workers": args.workers, **cupy},
        {"repeats": args.repeats, "sample_ms": args.sample_ms, "warmup_ms": 1.0, **cupy},
    )


def measure_into(
    m, target: Target, db: TuningDatabase, task: Task, configs: list[dict], regs: dict
) -> list[RecordIn]:
    """Build and run ``configs`` of ``task``, commit them as records of ``db`` and the registers each build
    reported into ``regs`` (workload key -> config JSON -> registers per thread, the largest over the
    candidate's kernels); the records committed."""
    from tuner.measure import MeasureInput

    inputs = [MeasureInput(task, c) for c in configs]
    builds = m.builder.build(inputs)
    ok = [i for i, b in enumerate(builds) if b.status == Status.OK]
    runs = dict(zip(ok, m.runner.run([inputs[i] for i in ok], [builds[i] for i in ok])))
    m.builder.release(builds)
    recs = []
    wl_regs = regs.setdefault(task.workload_key, {})
    for i, (c, b) in enumerate(zip(configs, builds)):
        r = runs.get(i)
        status, lat, err = (r.status, r.latencies_us, r.error) if r else (b.status, None, b.error)
        recs.append(RecordIn(task.workload_key, target.key, task.sketch.name, task.sketch.version, c,
                             lat, status, (err or "")[:2000] or None))  # fmt: skip
        n_regs = [int(kn["num_regs"]) for kn in (b.info or {}).get("kernels", []) if "num_regs" in kn]
        if n_regs:
            wl_regs[config_json(c)] = max(n_regs)
    db.commit_records(recs)
    return recs


def measuring(args: argparse.Namespace):
    """What collect and exhaust measure with: this GPU's target, ``--db`` (the target committed), the
    registers' sidecar file and what it holds, and the measurer."""
    target = Target.parse("cuda")
    db = TuningDatabase.open(args.db)
    db.commit_target(target.key, target.to_json())
    regs_path = Path(_db_file(args.db) + ".regs.json")
    regs: dict[str, dict[str, int]] = json.loads(regs_path.read_text()) if regs_path.exists() else {}
    return target, db, regs_path, regs, cuda_measurer(args, target)


def collect(args: argparse.Namespace) -> None:
    target, db, regs_path, regs, m = measuring(args)
    t0 = time.monotonic()
    n_workloads = n_ok = 0
    print(f"target {target.key}; pools of {args.pool} + default; budget {args.budget_s:.0f} s", flush=True)
    try:
        for k in range(args.first, args.first + args.count):
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget spent before rand{k}", flush=True)
                break
            t1 = time.monotonic()
            task = workload_task(k, target)
            db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
            known = {config_json(r.config) for r in db.find_records(task.workload_key, target.key)}
            configs = {config_json(c): c for c in [task.default(), *uniform_pool(task, args.pool, k)]}
            todo = [c for key, c in configs.items() if key not in known]
            recs = measure_into(m, target, db, task, todo, regs)
            regs_path.write_text(json.dumps(regs))
            by = Counter(str(r.status) for r in recs)
            n_workloads, n_ok = n_workloads + 1, n_ok + by["ok"]
            lats = [float(np.median(r.latencies_us)) for r in recs if r.latencies_us]
            span = f"best {min(lats):.1f} us, worst {max(lats):.1f} us" if lats else "nothing ok"
            role = "held out" if held_out(k) else "dev"
            print(f"rand{k} {task.kind} {role}: {len(recs)} measured {dict(sorted(by.items()))}, {span} "
                  f"({time.monotonic() - t1:.1f} s)", flush=True)  # fmt: skip
    finally:
        m.close()
        print(f"collected: {n_workloads} workloads, {n_ok} ok configs", flush=True)


# ------------------------------------------------------------------------------------------------ exhaust
def exhaust_specs(target: Target, per_kind: int = EXHAUST_PER_KIND) -> list[str]:
    """The exhaustive set, fixed before anything of it was measured: the first ``per_kind`` contractions and
    reductions of random_workload(EXHAUST_FIRST), (EXHAUST_FIRST + 1), ..., as ``synth:randK@gpu`` specs
    (bench_cost_model.GPU_FREE_KNOBS), in the measuring order: the kinds alternate, contraction first, so
    that a cut by the budget keeps both kinds."""
    found: dict[str, list[str]] = {"contraction": [], "reduction": []}
    k = EXHAUST_FIRST
    while any(len(v) < per_kind for v in found.values()):
        kind = workload_task(k, target).kind
        if kind in found and len(found[kind]) < per_kind:
            found[kind].append(f"synth:rand{k}@gpu")
        k += 1
    return [s for pair in zip(found["contraction"], found["reduction"]) for s in pair]


def exhaust(args: argparse.Namespace) -> None:
    """Measure every valid config of each exhaustive sub-space (exhaust_specs) into ``--db``, in chunks
    committed as they are measured; a workload already complete there is skipped, a partial one continued.
    No new chunk is started after ``--budget-s``."""
    target, db, regs_path, regs, m = measuring(args)
    t0 = time.monotonic()
    complete: list[str] = []
    specs = exhaust_specs(target, args.per_kind)
    print(f"target {target.key}; {len(specs)} sub-spaces: {', '.join(specs)}; budget {args.budget_s:.0f} s",
          flush=True)  # fmt: skip
    try:
        for spec in specs:
            task = get_task(spec, target, sub=True)
            db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
            configs = valid_configs(task)
            known = {config_json(r.config) for r in db.find_records(task.workload_key, target.key)}
            todo = [c for c in configs if config_json(c) not in known]
            t1 = time.monotonic()
            for i in range(0, len(todo), args.chunk):
                if time.monotonic() - t0 > args.budget_s:
                    break
                measure_into(m, target, db, task, todo[i : i + args.chunk], regs)
                regs_path.write_text(json.dumps(regs))
            done = {config_json(r.config): r for r in db.find_records(task.workload_key, target.key)}
            have = [done[config_json(c)] for c in configs if config_json(c) in done]
            by = Counter(str(r.status) for r in have)
            lats = [r.median_us for r in have if r.median_us is not None]
            d = done.get(config_json(task.default()))
            ratio = f", default/best {d.median_us / min(lats):.2f}" if lats and d and d.median_us else ""
            print(f"{spec} {task.kind}: {len(have)} of {len(configs)} configs {dict(sorted(by.items()))}"
                  + (f", best {min(lats):.1f} us{ratio}" if lats else "")
                  + f" ({time.monotonic() - t1:.1f} s)", flush=True)  # fmt: skip
            if len(have) == len(configs):
                complete.append(spec)
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget spent after {spec}", flush=True)
                break
    finally:
        m.close()
        print(f"exhausted: {len(complete)} complete sub-spaces ({', '.join(complete) or 'none'})", flush=True)


def _db_file(url: str) -> str:
    if not url.startswith("sqlite:///"):
        raise SystemExit(f"--db {url!r}: a sqlite:/// URL (the registers' sidecar file sits beside it)")
    return url.removeprefix("sqlite:///")


# ------------------------------------------------------------------------------------------------ search
SEARCH_METHODS = "tpe,random,tpe+analytic,tpe+gbdt,tpe+gbdt-warm"
SEARCH_INTRO = """\
# Searches on CUDA, replayed from exhaustively measured sub-spaces (GPU measurements)

Generated by one command: `{command}` ({date}; git {git}; replayed on {cpu}). Every table below is its
output.

**Data.** `scripts/bench_cost_model_cuda.py exhaust` measured every valid config of each sub-space on the GPU
of target `{target}` (`{db}`; log beside it): the first contractions and reductions of `random_workload` from
index {first} on (a range no other set uses), contractions over their block and register tiles (bm, bn, bk,
tm, tn; the other knobs at the sketch's default), reductions over threads per row, rows per block, vector
width and unroll (keep_row and fast_math at the default); the set and its sub-spaces were fixed and
committed (8ad8919) before anything of them was measured, and the set is the sub-spaces the GPU's time
completed, in the fixed order. Nothing was developed on this data: the models and the search are the ones
the CPU benchmarks use, unchanged.

**Replay.** Each run is a real `TaskTuner` search whose measurements are answered from that table, so the
goal is the sub-space's true best (the best of every config, each measured once) and every method sees
the same latency for a config. Methods: TPE alone, random, TPE + analytic prior, TPE + GBDT starting cold
(no other workload's records: what `kiln tune --cost-model gbdt` runs on a new database) and TPE + GBDT
warm-started from the CUDA TenSet pools `{train}` (rand7000-7063, disjoint from this set; twins excluded
by family). The search does not measure the rule-based default first (its latency is shown for
reference). A config the device could not run ({failed}; the builder now rejects such configs before
compiling, commit 5ce2561) is a failed trial for every method alike. Features use estimated registers, as
`kiln tune` does. {runs}

Sub-spaces searched: {specs}.

"""


def complete_specs(db: TuningDatabase, target: Target) -> list[str]:
    """The exhaustive sub-spaces (exhaust_specs' order) every valid config of which has a record in ``db``."""
    out = []
    for spec in exhaust_specs(target):
        task = get_task(spec, target, sub=True)
        have = {config_json(r.config) for r in db.find_records(task.workload_key, target.key)}
        if all(config_json(c) in have for c in valid_configs(task)):
            out.append(spec)
    return out


def work_copy(url: str, work: Path) -> str:
    """A copy of the database file ``url`` under ``work``, named by its content's hash: replays write
    (targets, workloads, feature caches) into their cache and training databases, never into committed
    data files."""
    import hashlib
    import shutil

    path = Path(_db_file(url))
    if not path.is_file():
        raise SystemExit(f"{url}: no such database file")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    out = work / f"{path.stem}_{digest}.db"
    if not out.exists():
        shutil.copyfile(path, out)
    return f"sqlite:///{out}"


def merged(urls: list[str], work: Path) -> str:
    """One database under ``work`` holding everything of the databases of ``urls`` (the warm start reads
    one), named by their contents' hashes."""
    import hashlib

    digest = hashlib.sha256(b"".join(Path(_db_file(u)).read_bytes() for u in urls)).hexdigest()[:12]
    out = work / f"cuda_train_{digest}.db"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        with TuningDatabase.open(f"sqlite:///{tmp}") as dst:
            for url in urls:
                dst.merge_from(url, strict=True)
        tmp.rename(out)
    return f"sqlite:///{out}"


def only_cuda_target(db: TuningDatabase, what: str) -> Target:
    """The one CUDA target ``db`` holds records of (as the database describes it)."""
    keys = sorted(k for k in db.target_keys() if k.startswith("cuda/"))
    if len(keys) != 1:
        raise SystemExit(f"{what}: one CUDA target expected, found {keys or 'none'}")
    return target_of(db, keys[0])


def search(args: argparse.Namespace) -> None:
    """Replay the search methods over the complete exhaustive sub-spaces of ``--db``; the report to
    ``--report``."""
    import contextlib
    import datetime
    import io

    from scripts import bench_cost_model as bcm

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = TuningDatabase.open(args.db)
    target = only_cuda_target(src, f"--db {args.db}")
    specs = complete_specs(src, target)
    if not specs:
        raise SystemExit(f"--db {args.db}: no exhaustive sub-space is complete (run exhaust on a GPU)")
    failed = []
    for spec in specs:
        task = get_task(spec, target, sub=True)
        n = sum(r.status != Status.OK for r in src.find_records(task.workload_key, target.key))
        if n:
            failed.append(f"{n} configs of {spec}")
    src.close()
    print(f"target {target.key}; complete sub-spaces: {', '.join(specs)}", flush=True)
    rargs = argparse.Namespace(
        cache=work_copy(args.db, work),
        train_cache=merged(args.train, work),
        target=target.key,
        threads=1,
        workloads=",".join(specs),
        methods=args.methods,
        seeds=args.seeds,
        trials=args.trials,
        batch=args.batch,
        oversample=args.oversample,
        epsilon=args.epsilon,
        results=str(work / "results"),
        no_default=True,
        force=False,
        gbdt="",
    )
    if args.run_dir:  # runs made before (their protocol.json names the commit and code that made them)
        run_dir = Path(args.run_dir)
        proto = json.loads((run_dir / "protocol.json").read_text())["protocol"]
        if proto.get("target") != target.key or proto.get("trials") != args.trials:
            raise SystemExit(
                f"--run-dir {run_dir}: runs of target {proto.get('target')} with {proto.get('trials')} "
                f"trials, not {target.key} with {args.trials}"
            )
    else:
        bcm.run(rargs)
        run_dir = bcm.protocol_dir(rargs)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bcm.report(argparse.Namespace(run_dir=str(run_dir), out=args.out, suffix="_cuda_search",
                                      resamples=args.resamples))  # fmt: skip
    intro = SEARCH_INTRO.format(
        command=f"python scripts/bench_cost_model_cuda.py {shlex.join(sys.argv[1:])}",
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        git=git_commit()[:12],
        cpu=cpu_name(),
        target=target.key,
        db=_db_file(args.db),
        first=EXHAUST_FIRST,
        train=", ".join(_db_file(u) for u in args.train),
        specs=", ".join(specs),
        failed=", ".join(failed) or "none",
        runs=(
            f"The runs were made before, by this command without `--run-dir` and `--report` (at the commit "
            f"the Protocol line names; the directory `{args.run_dir}` holds one file per run and its "
            f"protocol.json)."
            if args.run_dir
            else ""
        ),
    )
    text = intro + "## Search efficiency\n\n" + buf.getvalue().strip() + "\n"
    print(text)
    if args.report:
        Path(args.report).write_text(text)
        print(f"wrote {args.report}")


# ------------------------------------------------------------------------------------------------ compare
def compare(args: argparse.Namespace) -> None:
    """Two exhaust databases of the same sub-spaces measured under different code (``--before``, e.g. the
    committed H200 data, and ``--after``, a new `exhaust` run): per contraction sub-space, the median
    after/before latency ratio of the configs whose tiles leave a partial edge tile and of those whose tiles
    divide the output (the control), and each side's best."""
    from compiler.backends.cuda.sketches.contraction import G

    sides = {"before": args.before, "after": args.after}
    dbs = [TuningDatabase.open(u) for u in sides.values()]
    targets = [only_cuda_target(db, f"--{side} {u}") for db, (side, u) in zip(dbs, sides.items())]
    target = targets[0]
    print(f"before `{args.before}` ({targets[0].key}), after `{args.after}` ({targets[1].key})")
    print()
    print("| sub-space | M x N | partial-tile configs | median after/before | whole-tile configs | "
          "median after/before | best before us | best after us |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for spec in exhaust_specs(target):
        task = get_task(spec, target, sub=True)
        if task.kind != "contraction":
            continue
        lat = []
        for db, t in zip(dbs, targets):
            recs = db.find_records(task.workload_key, t.key)
            lat.append({config_json(r.config): r.median_us for r in recs if r.median_us})
        both = [c for c in lat[0] if c in lat[1]]
        if not both:
            continue
        m_ext, n_ext = G.anchor_extents(task.group)
        split: dict[bool, list[float]] = {True: [], False: []}
        for c in both:
            cfg = json.loads(c)
            whole = m_ext % cfg["bm"] == 0 and n_ext % cfg["bn"] == 0
            split[whole].append(lat[1][c] / lat[0][c])
        cells = [f"{len(v)} | {np.median(v):.2f}" if v else "0 | -" for v in (split[False], split[True])]
        print(f"| {spec} | {m_ext} x {n_ext} | {cells[0]} | {cells[1]} | {min(lat[0].values()):.1f} | "
              f"{min(lat[1].values()):.1f} |")  # fmt: skip


# ------------------------------------------------------------------------------------------------ heldout
class Source:
    """One collected database: its records of the target and the registers its builds reported."""

    def __init__(self, url: str) -> None:
        path = Path(_db_file(url))
        if not path.is_file():
            raise SystemExit(f"--db {url}: no such database file")
        regs_path = Path(f"{path}.regs.json")
        self.path = path
        self.db = TuningDatabase.open(url)
        self.regs: dict[str, dict[str, int]] = json.loads(regs_path.read_text()) if regs_path.exists() else {}
        self.records: list[Any] = []

    def load(self, target_key: str) -> None:
        self.records = self.db.find_records(None, target_key)

    def reported(self, record: Any) -> int | None:
        return self.regs.get(record.workload_key, {}).get(config_json(record.config))


def dataset(sources: list[Source], target_key: str, reported: bool) -> Dataset:
    """Every usable record of the sources with features (cost_model/dataset.py's rules), the registers as the
    builds reported them when ``reported``, else estimated."""
    ex = FeatureExtractor()
    parts = [
        load_dataset(src.db, target_key, ex, records=src.records, cache=False,
                     registers=src.reported if reported else None)
        for src in sources
    ]  # fmt: skip
    return Dataset(
        np.concatenate([d.x for d in parts]),
        np.concatenate([d.latencies for d in parts]),
        [w for d in parts for w in d.workloads],
        [i for d in parts for i in d.record_ids],
        {w: k for d in parts for w, k in d.kinds.items()},
    )


def paired_interval(a: EvalResult, b: EvalResult, metric: str) -> tuple[float, float]:
    """Bootstrap 90% interval (scipy.stats.bootstrap, percentile) of the mean of ``a - b`` over the workloads
    both scored (paired by workload)."""
    from scipy.stats import bootstrap

    bv = {r.workload: getattr(r, metric) for r in b.rows}
    d = [getattr(r, metric) - bv[r.workload] for r in a.rows if r.workload in bv]
    d = [x for x in d if not math.isnan(x)]
    if len(d) < 2 or np.ptp(d) == 0:
        return (d[0], d[0]) if d else (math.nan, math.nan)
    ci = bootstrap((np.asarray(d),), np.mean, confidence_level=0.9, method="percentile", n_resamples=10000,
                   random_state=0).confidence_interval  # fmt: skip
    return float(ci.low), float(ci.high)


def default_vs_best(sources: list[Source], tasks: dict[str, Task], out) -> None:
    """Not a cost-model figure: how far the rule-based default is from the best config of its pool, by kind
    (every workload whose default was measured, development and held out)."""
    lat: dict[str, dict[str, float]] = {}
    for src in sources:
        for r in src.records:
            if r.median_us is not None and Status(r.status) == Status.OK:
                lat.setdefault(r.workload_key, {})[config_json(r.config)] = float(r.median_us)
    ratios: dict[str, list[float]] = {}
    for key, task in tasks.items():
        pool = lat.get(key, {})
        d = pool.get(config_json(task.default()))
        if d is not None:
            ratios.setdefault(task.kind, []).append(d / min(pool.values()))
    out()
    out("## The rule-based default against its pool's best")
    out()
    out("Not a cost-model figure: the default's latency over the best of its pool (the default and 32 "
        "uniform configs), per workload.")  # fmt: skip
    out()
    out("| kind | workloads | median | p75 | max | default within 5% of the pool's best |")
    out("|---|---:|---:|---:|---:|---:|")
    for kind, r in sorted(ratios.items()):
        q = np.percentile(r, [50, 75, 100])
        near = sum(x <= 1.05 for x in r)
        out(f"| {kind} | {len(r)} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} | {near} of {len(r)} |")


def heldout(args: argparse.Namespace) -> None:
    sources = [Source(url) for url in args.db]
    keys = sorted({t for src in sources for t in src.db.target_keys() if t.startswith("cuda/")})
    target_key = args.target or (keys[0] if len(keys) == 1 else None)
    if target_key is None:
        raise SystemExit(f"{args.db}: name the CUDA target with --target (CUDA targets: {keys or 'none'})")
    for src in sources:
        src.load(target_key)
    target = target_of(sources[0].db, target_key)
    draws: dict[str, list[int]] = {}  # workload key -> its indices (the draw can repeat a workload)
    tasks: dict[str, Task] = {}
    for k in range(FIRST, FIRST + COUNT):
        task = workload_task(k, target)
        draws.setdefault(task.workload_key, []).append(k)
        tasks.setdefault(task.workload_key, task)

    def name(key: str) -> str:  # a workload drawn twice is named by its last index
        return f"rand{draws[key][-1]}"

    def is_held(key: str) -> bool:  # held out if any of its draws is: never trained on
        return any(held_out(k) for k in draws[key])

    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    out("# Cost model on CUDA: held-out ranking (GPU measurements)")
    out()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = f"python scripts/bench_cost_model_cuda.py {shlex.join(sys.argv[1:])}"
    out(f"Generated by one command: `{command}` ({when}; git {git_commit()}; analysed on {cpu_name()})"
        f". Data: `scripts/bench_cost_model_cuda.py collect` on the GPU of target `{target_key}` (see the "
        "module docstring for the protocol).")  # fmt: skip
    out()
    measured: set[str] = set()
    for src in sources:
        keys_there = {r.workload_key for r in src.records}
        measured |= keys_there
        out(f"- `{src.path}`: {len(keys_there)} workloads, {len(src.records)} records")
    for key, ks in draws.items():
        if len(ks) > 1 and key in measured:
            role = "held out" if is_held(key) else "development"
            twice = ", ".join(f"rand{k}" for k in ks)
            out(f"- the draw gave one workload twice ({twice}): it counts once, as "
                f"{name(key)}, with the configs of both pools, held out if either draw is ({role})")
    for reported in (True, False):
        data = dataset(sources, target_key, reported)
        known = [w for w in dict.fromkeys(data.workloads) if w in draws]
        dev = data.only(w for w in known if not is_held(w))
        held = data.only(w for w in known if is_held(w))
        n_ok = int(np.isfinite(data.latencies).sum())
        out()
        how = "as the build reported them" if reported else "estimated (as kiln tune ranks today)"
        out(f"## Registers {how}")
        out()
        n_dev, n_held = len(set(dev.workloads)), len(set(held.workloads))
        out(f"{len(known)} workloads ({n_dev} development, {n_held} held out), {len(data)} records with "
            f"features, {n_ok} ok.")  # fmt: skip
        results = []
        for label, (kind, opts) in MODELS.items():
            def make(kind=kind, opts=opts):
                return create_model(kind, **opts)

            cv = cross_validate(dev, make, label) if n_dev > 1 else EvalResult(label, "none")
            results.append((label, cv, train_and_score(dev, held, make, label)))
        out()
        out("| model | dev CV top-1 | dev CV top-5 | dev CV Spearman | held-out top-1 | held-out top-5 | "
            "held-out Spearman |")  # fmt: skip
        out("|---|---:|---:|---:|---:|---:|---:|")
        for label, cv, ho in results:
            out(f"| {label} | {cv.mean('top1'):.3f} | {cv.mean('top5'):.3f} | {cv.mean('spearman'):.3f} | "
                f"{ho.mean('top1'):.3f} | {ho.mean('top5'):.3f} | {ho.mean('spearman'):.3f} |")  # fmt: skip
        out()
        out("Held-out workloads, one pool each (top-1 / top-5 per model):")
        out()
        out("| workload | kind | ok configs | " + " | ".join(n for n, _, _ in results) + " |")
        out("|---|---|---:|" + "---:|" * len(results))
        by = [{r.workload: r for r in ho.rows} for _, _, ho in results]
        for r in results[0][2].rows:
            cells = [f"{b[r.workload].top1:.3f} / {b[r.workload].top5:.3f}" for b in by if r.workload in b]
            out(f"| {name(r.workload)} | {r.kind} | {r.n} | " + " | ".join(cells) + " |")
        prior, gbdt = results[0][2], results[1][2]
        g5, p5 = gbdt.mean("top5"), prior.mean("top5")
        lo, hi = paired_interval(gbdt, prior, "top5")
        out()
        out(f"- held-out top-5 >= 0.92: **{'met' if g5 >= 0.92 else 'not met'}** (GBDT {g5:.3f})")
        better = "met" if higher(g5, p5) else "not met"
        out(f"- better than the analytic prior alone (top-5, 3 decimals): **{better}**"
            f" (GBDT {g5:.3f} vs prior {p5:.3f}; top-1 {gbdt.mean('top1'):.3f} vs {prior.mean('top1'):.3f};"
            f" GBDT - prior top-5 per held-out workload: mean {g5 - p5:+.3f}, bootstrap 90% interval"
            f" {lo:+.3f} to {hi:+.3f})")  # fmt: skip
    default_vs_best(sources, tasks, out)
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.report}")


def add_measure_options(q: argparse.ArgumentParser, budget_s: float, workers: int, budget_help: str) -> None:
    """The options of a command that measures on the GPU (collect, exhaust)."""
    q.add_argument("--db", required=True, help="sqlite:///FILE (the registers go to FILE.regs.json)")
    q.add_argument("--budget-s", type=float, default=budget_s, help=budget_help)
    q.add_argument("--workers", type=int, default=workers, help="NVRTC build processes")
    q.add_argument("--repeats", type=int, default=5)
    q.add_argument("--sample-ms", type=float, default=1.0)
    q.add_argument("--cupy-module", default=None, help="a simulated CuPy, for a dry run without a GPU")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="measure the CUDA pools (needs a GPU, or --cupy-module for a dry run)")
    add_measure_options(c, 240.0, 12, "no new workload is started after this")
    c.add_argument("--first", type=int, default=FIRST)
    c.add_argument("--count", type=int, default=COUNT)
    c.add_argument("--pool", type=int, default=POOL)
    e = sub.add_parser("exhaust", help="measure whole CUDA sub-spaces for replayed searches (needs a GPU)")
    add_measure_options(e, 480.0, 14, "no new chunk is started after this")
    e.add_argument("--per-kind", type=int, default=EXHAUST_PER_KIND)
    e.add_argument("--chunk", type=int, default=EXHAUST_CHUNK, help="configs built and run per commit")
    q = sub.add_parser("search", help="replay the search methods over the complete exhaustive sub-spaces")
    q.add_argument("--db", required=True, help="the exhaust database (sqlite:///FILE; read, never written)")
    q.add_argument(
        "--train", action="append", required=True, help="a collected database to warm-start from (repeat)"
    )
    q.add_argument("--methods", default=SEARCH_METHODS)
    q.add_argument("--work", default="/tmp/kiln_cm_cuda", help="copies of the databases and the run results")
    q.add_argument("--report", default=None)
    q.add_argument("--run-dir", default=None, help="report the runs of this protocol directory, run nothing")
    q.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "benchmarks"), help="curves")
    from scripts.bench_cost_model import add_search_options

    add_search_options(q, None, report=False)
    q.add_argument("--resamples", type=int, default=2000)
    k = sub.add_parser("compare", help="two exhaust databases: partial vs whole tiles, after / before")
    k.add_argument("--before", required=True, help="sqlite:///FILE (e.g. the committed H200 exhaust data)")
    k.add_argument("--after", required=True, help="sqlite:///FILE (an exhaust run under newer code)")
    h = sub.add_parser("heldout", help="score the GBDT and the prior on the held-out CUDA workloads")
    h.add_argument("--db", required=True, action="append", help="a collected database (repeat for several)")
    h.add_argument("--target", default=None, help="the CUDA target key (default: the database's only one)")
    h.add_argument("--report", default=None)
    args = p.parse_args(argv)
    commands = {"collect": collect, "exhaust": exhaust, "search": search, "compare": compare}
    {**commands, "heldout": heldout}[args.cmd](args)


if __name__ == "__main__":
    main()
