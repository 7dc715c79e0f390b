"""The shims' one compiled part: the KV shim's NIXL patches for the common call
(kv_transfer/_hotpath.c). Optional: where it cannot be built (no compiler or Python headers in
the image) the install goes on and the shim uses its Python patches, which do the same."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "railtrace_tracing.kv_transfer._hotpath",
            sources=["kv_transfer/_hotpath.c"],
            optional=True,
        )
    ]
)
