"""Incidents: flagged requests grouped by the part that explains them, with what they cost.

Computed on read from the stored summaries of a bounded window (docs/incidents.md says why not
at publish time): `incidents(store, topology, since_ns, until_ns)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Engine, select

from railtrace.incidents.group import Incident, Record, group, record_of
from railtrace.incidents.view import incident_dict, next_step, scope_of
from railtrace.store.schema import requests
from railtrace.topology.k8s_keys import APP_NAME_LABEL

# The most request rows one computation reads (the newest of the window): a bound on its time
# and memory whatever the window; past it the answer says `partial`.
MAX_ROWS = 50_000
DEFAULT_WINDOW_NS = 3600 * 10**9

__all__ = [
    "DEFAULT_WINDOW_NS",
    "MAX_ROWS",
    "Incident",
    "IncidentSet",
    "Record",
    "compute",
    "group",
    "incident_dict",
    "next_step",
    "record_of",
    "scope_of",
]


@dataclass(slots=True)
class IncidentSet:
    incidents: list[Incident]
    rows: int
    partial: str | None = None


def pool_namer(topology: Any) -> Any:
    """A pod's pool: its `app.kubernetes.io/name` label in the topology, else its workload name."""
    from railtrace.incidents.group import _default_pool

    cache: dict[str | None, str | None] = {}

    def pool_of(pod: str | None) -> str | None:
        if pod in cache:
            return cache[pod]
        name = None
        if pod and topology is not None:
            for p in topology.pods_named(pod)[:1]:
                name = (p.labels or {}).get(APP_NAME_LABEL)
        cache[pod] = name = name or _default_pool(pod)
        return name

    return pool_of


def load_records(
    engine: Engine, topology: Any, since_ns: int, until_ns: int, max_rows: int = MAX_ROWS
) -> tuple[list[Record], bool]:
    """The window's requests, newest `max_rows` at most (one indexed range read of
    `ix_requests_start`); True when the window held more."""
    r = requests.c
    stmt = (
        select(r.start_ns, r.summary)
        .where(r.start_ns >= since_ns, r.start_ns < until_ns)
        .order_by(r.start_ns.desc(), r.trace_id.desc())
        .limit(max_rows + 1)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        conn.commit()
    pool_of = pool_namer(topology)
    out = []
    for start_ns, blob in rows[:max_rows]:
        summary = orjson.loads(blob)
        summary["_start_ns"] = start_ns
        out.append(record_of(summary, pool_of))
    return out, len(rows) > max_rows


def compute(
    engine: Engine, topology: Any, since_ns: int, until_ns: int, max_rows: int = MAX_ROWS
) -> IncidentSet:
    records, more = load_records(engine, topology, since_ns, until_ns, max_rows)
    partial = (
        f"the window held more than {max_rows} requests: the newest {max_rows} were grouped" if more else None
    )
    return IncidentSet(group(records), len(records), partial)
