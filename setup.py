"""Build of the optional native data path (kvcast/_native.c); everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled, the install goes on and the pure-Python
paths run (hostagent.native says which one is in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvcast._native",
            ["kvcast/_native.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
            libraries=["dl"],
            optional=True,
        )
    ]
)
