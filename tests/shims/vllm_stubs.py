"""Import vLLM's real NIXL connector source from a release wheel without a GPU stack.

`import_real(tree, module)` runs in a fresh process (the tests call it through a subprocess): a
meta-path finder serves the files extracted from the wheel as they are, and a permissive stub for
everything else they import (torch, zmq, the rest of vLLM): any attribute is a class that can be
subclassed, called, indexed and combined with `|`. The connector's own classes and methods are
therefore vLLM's real code; only their dependencies are stand-ins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

REAL_THIRD_PARTY = ("numpy", "opentelemetry", "wrapt", "railtrace_tracing", "typing_extensions")


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(name)

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _StubMeta):
            return args[0]  # used as a decorator
        return super().__call__()


class Stub(metaclass=_StubMeta):
    def __init_subclass__(cls, **kwargs: Any) -> None:  # msgspec.Struct(omit_defaults=True, …)
        pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(name)()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Stub()

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__

    def __getitem__(self, item: Any) -> Any:
        return Stub()

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False


def _stub_class(name: str) -> type:
    return _StubMeta(name, (Stub,), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> Any:
        mod = _StubModule(spec.name)
        mod.__path__ = []  # a package: submodules are stubs too
        return mod

    def exec_module(self, module: Any) -> None:
        pass


class WheelFinder(importlib.abc.MetaPathFinder):
    """Real files from the extracted wheel under `tree`; stubs for what is not real."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top in REAL_THIRD_PARTY or fullname in sys.builtin_module_names:
            return None
        if top == "vllm":
            rel = Path(*fullname.split("."))
            file = self.tree / rel.with_suffix(".py")
            pkg = self.tree / rel / "__init__.py"
            if pkg.exists():
                return importlib.util.spec_from_file_location(
                    fullname, pkg, submodule_search_locations=[str(pkg.parent)]
                )
            if file.exists():
                return importlib.util.spec_from_file_location(fullname, file)
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        if importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None  # installed for real (stdlib, numpy …)
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


def install(tree: Path) -> None:
    sys.meta_path.insert(0, WheelFinder(tree))
    for name in ("torch", "zmq", "msgspec"):  # present or not, the GPU stack is stubbed
        sys.modules.pop(name, None)
        sys.modules[name] = _Loader().create_module(importlib.machinery.ModuleSpec(name, _Loader()))
