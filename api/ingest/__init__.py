"""Ingest: turn decoded spans into rows, commit them in groups, then acknowledge; assemble later."""

from railtrace.ingest.writer import BulkWriter, Overloaded, WriterUnavailable, prepare

__all__ = ["BulkWriter", "Overloaded", "WriterUnavailable", "prepare"]
