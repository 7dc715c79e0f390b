"""The correlator service: app factory, OTLP receivers (HTTP and gRPC), REST API, runner."""

from railtrace.server.app import create_app
from railtrace.server.runtime import Runtime

__all__ = ["Runtime", "create_app"]
