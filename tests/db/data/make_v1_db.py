"""Make ``kiln_v0001.sqlite``: a small tuning database at the FIRST schema revision (0001).

The migration tests open a copy of it to check that an old database is refused until it is upgraded, and
that ``kiln db upgrade`` carries every row over. It was made once with this script and committed; rerun it
only if revision 0001 itself changes (it should not: released revisions are frozen).

    python tests/db/data/make_v1_db.py [OUT]        # default: tests/db/data/kiln_v0001.sqlite
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import Connection  # noqa: E402

from db import migrate  # noqa: E402
from db.engine import make_engine  # noqa: E402

OUT = Path(__file__).resolve().parent / "kiln_v0001.sqlite"
T0 = "2026-11-01 10:00:00.000000"
CPU = "cpu/x86_64/AMD EPYC 9B14/2"
GPU = "cuda/sm_90/NVIDIA H100 80GB HBM3"
W1 = "9f2c" + "0" * 60
W2 = "a1b2" + "1" * 60


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def fill_v1(conn: Connection) -> None:
    """Insert the sample rows into a database at revision 0001 (also used by the PostgreSQL test)."""
    conn.execute(
        text(
            "INSERT INTO kiln_workloads (id, key, canonical, kind, flops, bytes, created_at) VALUES "
            "(1, :w1, :c1, 'reduction', 32768, 65536, :t), (2, :w2, :c2, 'pointwise', 1024, 8192, :t)"
        ),
        {
            "w1": W1,
            "w2": W2,
            "c1": canonical({"ops": ["reduce_max", "subtract", "exp", "reduce_sum", "divide"]}),
            "c2": canonical({"ops": ["add"], "shape": [1024]}),
            "t": T0,
        },
    )
    conn.execute(
        text(
            "INSERT INTO kiln_targets (id, key, info, created_at) VALUES "
            "(1, :cpu, :ci, :t), (2, :gpu, :gi, :t)"
        ),
        {"cpu": CPU, "gpu": GPU, "ci": canonical({"cores": 2}), "gi": canonical({"sm": 90}), "t": T0},
    )
    conn.execute(
        text(
            "INSERT INTO kiln_runs (id, model_name, model_hash, target_id, budget, command_line, host, "
            "kiln_version, started_at, finished_at) VALUES (1, 'softmax', 'h0', 1, :b, "
            "'kiln tune --model softmax', 'oldhost', '0.0.9', :t, '2026-11-01 10:05:00.000000')"
        ),
        {"b": canonical({"trials": 8}), "t": T0},
    )
    records = [
        # (workload id, target id, config, latencies, median, status, error, minute)
        (1, 1, {"threads": 2, "vector": 8}, [12.0, 11.0, 13.0], 12.0, "ok", None, 1),
        (1, 1, {"threads": 2, "vector": 16}, [9.5, 9.0, 9.75], 9.5, "ok", None, 2),
        (1, 1, {"threads": 1, "vector": 16}, [9.5, 9.5, 9.5], 9.5, "ok", None, 3),
        (1, 1, {"threads": 4, "vector": 64}, None, None, "compile_error", "error: vector too wide", 4),
        (1, 2, {"threads_per_row": 128, "unroll": 1}, [4.1, 4.0, 4.1], 4.1, "ok", None, 5),
        (2, 1, {"vector": 8}, [1.0, 1.25], 1.125, "ok", None, 6),
        (2, 1, {"vector": 3}, None, None, "invalid_config", "vector must divide 1024", 7),
    ]
    for i, (wid, tid, config, lat, med, status, error, minute) in enumerate(records, start=1):
        conn.execute(
            text(
                "INSERT INTO kiln_records (id, workload_id, target_id, sketch, sketch_version, config, "
                "latencies, median_us, status, error, kiln_version, host, run_id, created_at) VALUES "
                "(:id, :w, :t, :s, 1, :c, :l, :m, :st, :e, '0.0.9', 'oldhost', 1, :at)"
            ),
            {
                "id": i,
                "w": wid,
                "t": tid,
                "s": "reduction" if wid == 1 else "pointwise",
                "c": canonical(config),
                "l": canonical(lat) if lat is not None else None,
                "m": med,
                "st": status,
                "e": error,
                "at": f"2026-11-01 10:{minute:02d}:00.000000",
            },
        )
    conn.execute(
        text(
            "INSERT INTO kiln_model_tasks (id, model_name, model_hash, workload_id, weight, created_at) "
            "VALUES (1, 'softmax', 'h0', 1, 1, :t), (2, 'softmax', 'h0', 2, 2, :t)"
        ),
        {"t": T0},
    )
    conn.execute(
        text(
            "INSERT INTO kiln_fusion_plans (id, region_key, target_id, plan, latency_us, kiln_version, "
            "host, created_at) VALUES (1, 'region0', 1, :p, 20.5, '0.0.9', 'oldhost', :t)"
        ),
        {"p": canonical({"edges": [[0, 1]]}), "t": T0},
    )
    if conn.dialect.name == "postgresql":  # explicit ids above: move the id sequences past them
        for table in ("kiln_workloads", "kiln_targets", "kiln_runs", "kiln_records", "kiln_model_tasks"):
            conn.execute(
                text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            )
        conn.execute(text("SELECT setval(pg_get_serial_sequence('kiln_fusion_plans', 'id'), 1)"))


def main(out: Path = OUT) -> None:
    out.unlink(missing_ok=True)
    url = f"sqlite:///{out}"
    engine = make_engine(url)
    migrate.upgrade(engine, url, "0001")
    with engine.connect() as conn, conn.begin():
        fill_v1(conn)
    raw = engine.raw_connection()  # outside any transaction: VACUUM cannot run in one
    raw.execute("PRAGMA journal_mode = DELETE")
    raw.execute("VACUUM")
    raw.close()
    engine.dispose()
    print(f"wrote {out} at revision 0001")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
