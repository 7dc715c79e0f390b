"""The one settings object. Every option reads from a `RAILTRACE_*` environment variable."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_db_url() -> str:
    return f"sqlite:///{Path.cwd() / 'railtrace.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAILTRACE_", env_ignore_empty=True, extra="ignore")

    db: str = Field(default_factory=default_db_url, description="SQLAlchemy URL of the store.")
    topology: list[str] = Field(default_factory=list, description="Topology files or folders.")
    host: str = "127.0.0.1"
    port: int = 4318
    grpc_port: int = 4317

    # Ingest.
    max_body_bytes: int = Field(16 * 1024 * 1024, description="Limit before and after decompression.")
    max_pending_spans: int = Field(200_000, description="Accepted-but-uncommitted spans before 429/503.")
    write_batch_spans: int = 4096
    retry_after_s: int = 1

    # Assembly.
    quiet_period_s: float = Field(2.0, description="A request is assembled this long after its last span.")
    assembly_interval_s: float = 0.25
    max_trace_wait_s: float = Field(300.0, description="Assemble even without an ended root after this.")

    # Verdicts.
    score_tolerance: float = Field(0.05, description="Router scores this close count as comparable.")
    slow_fraction: float = Field(0.25, description="Below this share of expected bandwidth is slow.")

    # Storage.
    retention_hours: float = Field(0.0, description="Delete requests older than this; 0 keeps all.")

    @field_validator("db")
    @classmethod
    def _normalise_db(cls, value: str) -> str:
        if value.startswith("postgresql://") or value.startswith("postgres://"):
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value
