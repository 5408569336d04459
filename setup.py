"""Build of the optional native code; everything else is in pyproject.toml.

kvcast/_native.c is the host data path, controlplane/policies/_kvcast_native.c the kvcast
policy's record path.

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
        ),
        Extension(
            "controlplane.policies._kvcast_native",
            ["controlplane/policies/_kvcast_native.c"],
            # No fused multiply-add: the C record path must round exactly as Python does.
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
