"""The one compiled part: `traceq.loader._events`, optional. Without a C compiler the
install goes on without it and the loader reads every batch the pure-Python way."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "traceq.loader._events",
            ["traceq/loader/_events.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
