"""Maps the top-level folders onto import names that cannot clash in a user's process.

`api/` is imported as `railtrace` and `tracing/` as `railtrace_tracing` (the latter is built by
tracing/pyproject.toml as the `railtrace-shims` distribution): a bare `api` or
`tracing` package would shadow (or be shadowed by) modules of the same name inside vLLM,
a gateway or any other host application the shims are loaded into.

The service's C accelerators are optional: without a compiler the install still works and the
service takes the same code paths in Python (slower).
"""

from setuptools import Extension, find_packages, setup

# `railtrace_tracing` (tracing/) is its own distribution, railtrace-shims (tracing/pyproject.toml).
FOLDERS = {"railtrace": "api"}


def _packages() -> list[str]:
    names: list[str] = []
    for name, folder in FOLDERS.items():
        names.append(name)
        names.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return names


ACCELERATORS = [
    Extension("railtrace.otlp._wirescan", ["api/otlp/_wirescan.c"], optional=True),
    # Reads stored spans without upb (railtrace.otlp.spans); without it, through upb.
    Extension("railtrace.otlp._spandecode", ["api/otlp/_spandecode.c"], optional=True),
]

setup(packages=_packages(), package_dir=dict(FOLDERS), ext_modules=ACCELERATORS)
