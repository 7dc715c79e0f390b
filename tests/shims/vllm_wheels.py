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


def main() -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    for version in MATRIX:
        print(f"vLLM {version}: {fetch(version)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
