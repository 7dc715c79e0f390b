"""Database outages of any length, ended without a restart of the service.

    .venv/bin/python -m benchmarks.reliability.outage --seconds 60 [--pg URL] [--sqlite-only | --pg-only]
        [--silent]

PostgreSQL is cut off (`--silent`: its packets dropped) through a TCP proxy (the server
itself is never stopped: a throwaway schema on it is used and dropped); SQLite lives on a
small tmpfs that is filled and freed (needs root; without it the service's file size limit is
lowered and restored). Official HTTP and gRPC exporters send throughout. Prints one JSON line per
database: outage length, when /readyz turned and came back, exports accepted right after,
/healthz answers during and after, acknowledged spans lost (must be 0). The same harness runs
the 5 s outages of tests/reliability/test_db_outage.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.reliability.outage_harness import pg_outage, sqlite_disk_full


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--restart-after", type=float, default=300, help="write_failure_restart_s")
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--sqlite-only", action="store_true")
    ap.add_argument("--pg-only", action="store_true")
    ap.add_argument("--silent", action="store_true", help="PostgreSQL: drop packets instead of cutting")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.sqlite_only:
            schema = f"rt_outage_{uuid.uuid4().hex[:10]}"
            admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            url = make_url(args.pg).update_query_dict({"options": f"-csearch_path={schema}"})
            try:
                pg_work = work / "pg"
                pg_work.mkdir()
                fig = pg_outage(
                    url.render_as_string(hide_password=False), pg_work, args.seconds, args.restart_after
                )
                print(json.dumps({"db": "postgresql", **fig}), flush=True)
                ok &= fig["lost_spans"] == 0
            finally:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                admin.dispose()
        if not args.pg_only:
            sq_work = work / "sqlite"
            sq_work.mkdir()
            fig = sqlite_disk_full(sq_work, args.seconds)
            print(json.dumps({"db": "sqlite", **fig}), flush=True)
            ok &= fig["lost_spans"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
