"""Real vLLM release wheels, downloaded once and cached outside the repository.

`python -m tests.shims.vllm_wheels` (run by scripts/setup-test-env) fetches the releases of
`railtrace_tracing.kv_transfer.vllm.MATRIX` with `pip download --no-deps` and extracts only the
Python files the checks read (the NIXL connector, the plugin loader, `envs.py`, the engine's
input processor) into `~/.cache/railtrace/vllm/<version>/`, then deletes the ~250-450 MB wheel.
A rerun finds the extracted tree and does nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from railtrace_tracing.kv_transfer.vllm import MATRIX

# Every vLLM release on PyPI in the supported range (`pip index versions vllm`, 0.11.0 - 0.34.0).
# `--all` fetches them and RAILTRACE_VLLM_MATRIX=all runs the wheel tests on each (about 6 min to
# download the first time, then seconds).
ALL_RELEASES = (
    "0.11.0",
    "0.11.1",
    "0.11.2",
    "0.12.0",
    "0.13.0",
    "0.14.0",
    "0.14.1",
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)


def versions() -> tuple[str, ...]:
    """The releases the wheel tests run on: MATRIX, or every release with RAILTRACE_VLLM_MATRIX=all."""
    return ALL_RELEASES if os.environ.get("RAILTRACE_VLLM_MATRIX", "") == "all" else MATRIX


CACHE = Path(os.environ.get("RAILTRACE_CACHE", Path.home() / ".cache" / "railtrace")) / "vllm"
WANTED = (
    "vllm/distributed/kv_transfer/",
    "vllm/plugins/",
    "vllm/envs.py",
    "vllm/version.py",
    "vllm/_version.py",
    "vllm/v1/engine/input_processor.py",
    "vllm/v1/engine/processor.py",
)
MARKER = ".railtrace-complete"


def tree(version: str) -> Path:
    return CACHE / version


def have(version: str) -> bool:
    return (tree(version) / MARKER).exists()


def fetch(version: str) -> Path:
    """The extracted tree of vLLM `version`, downloading its wheel first if needed."""
    dest = tree(version)
    if have(version):
        return dest
    with tempfile.TemporaryDirectory(
        prefix="railtrace-vllm-", dir=CACHE.parent if CACHE.parent.exists() else None
    ) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-cache-dir",  # the wheel is deleted once extracted: keep no second copy
                "--only-binary=:all:",
                f"vllm=={version}",
                "-d",
                tmp,
            ],
            check=True,
        )
        [wheel] = list(Path(tmp).glob("vllm-*.whl"))
        if dest.exists():
            shutil.rmtree(dest)
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.endswith(".py") and name.startswith(WANTED):
                    zf.extract(name, dest)
    (dest / MARKER).write_text(f"vllm {version} from PyPI (pip download --no-deps)\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    args = sys.argv[1:] if argv is None else argv
    for version in ALL_RELEASES if "--all" in args else versions():
        print(f"vLLM {version}: {fetch(version)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
