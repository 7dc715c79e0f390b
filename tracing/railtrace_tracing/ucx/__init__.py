"""UCX log evidence: which transport and device an endpoint actually used."""

from railtrace_tracing.ucx.parser import (
    Endpoint,
    Evidence,
    ProtoTable,
    UcxLog,
    UcxLogParser,
    classify,
    parse_config_cell,
    parse_file,
    parse_text,
)

__all__ = [
    "Endpoint",
    "Evidence",
    "ProtoTable",
    "UcxLog",
    "UcxLogParser",
    "classify",
    "parse_config_cell",
    "parse_file",
    "parse_text",
]
