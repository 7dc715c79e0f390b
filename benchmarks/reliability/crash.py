"""Long crash-safety run: kill -9 `railtrace serve` mid-ingest N times per database.

    .venv/bin/python -m benchmarks.reliability.crash --rounds 20 [--pg URL] [--sqlite-only]

Prints one JSON line per database: kills, exports acknowledged/failed, spans acknowledged,
spans lost (must be 0), and whether every acknowledged trace was assembled after the last
restart. Uses the same harness as tests/reliability/test_crash_safety.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.reliability.crash_harness import Server, assembled, crash_rounds, stored


def run(db_url: str, workdir: Path, rounds: int) -> dict[str, object]:
    started = time.monotonic()
    figures = crash_rounds(db_url, workdir, rounds)
    ledger = figures.pop("ledger")
    server = Server(db_url, workdir)
    server.wait_ready()
    lost = len(ledger.acked - stored(db_url))  # type: ignore[attr-defined]
    traces = {t for t, _ in ledger.acked}  # type: ignore[attr-defined]
    deadline = time.monotonic() + 300
    while not traces <= assembled(db_url) and time.monotonic() < deadline:
        time.sleep(0.5)
    unassembled = len(traces - assembled(db_url))
    code = server.terminate()
    return {
        **figures,
        "lost_spans": lost,
        "acked_traces": len(traces),
        "unassembled_traces": unassembled,
        "sigterm_exit": code,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--sqlite-only", action="store_true")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = run(f"sqlite:///{work / 'crash.db'}", work, args.rounds)
        print(json.dumps({"db": "sqlite", **result}), flush=True)
        ok &= result["lost_spans"] == 0 and result["unassembled_traces"] == 0
        if not args.sqlite_only:
            admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
            schema = f"rt_crash_{uuid.uuid4().hex[:10]}"
            with admin.connect() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            url = make_url(args.pg).update_query_dict({"options": f"-csearch_path={schema}"})
            try:
                result = run(url.render_as_string(hide_password=False), work, args.rounds)
                print(json.dumps({"db": "postgresql", **result}), flush=True)
                ok &= result["lost_spans"] == 0 and result["unassembled_traces"] == 0
            finally:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                admin.dispose()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
