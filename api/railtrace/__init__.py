"""railtrace correlator service (imported as `railtrace`; the folder is `api/`)."""

__version__ = "0.1.0"
