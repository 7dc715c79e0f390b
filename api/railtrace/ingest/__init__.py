"""Ingest: accept an export call (one path for both receivers), commit its rows in groups, then
acknowledge. Assembly is scheduled later, from the store (`railtrace.scheduling`)."""

from railtrace.ingest.accept import Accepted, ExportAcceptor, Outcome
from railtrace.ingest.writer import BulkWriter, Overloaded, WriterUnavailable

__all__ = ["Accepted", "BulkWriter", "ExportAcceptor", "Outcome", "Overloaded", "WriterUnavailable"]
