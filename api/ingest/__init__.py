"""Ingest: turn decoded spans into rows, commit them in groups, then acknowledge. Assembly is
scheduled later, from the store (`railtrace.scheduling`)."""

from railtrace.ingest.writer import BulkWriter, Overloaded, WriterUnavailable, prepare

__all__ = ["BulkWriter", "Overloaded", "WriterUnavailable", "prepare"]
