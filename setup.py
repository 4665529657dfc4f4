"""Build hook for the optional C kernels in native/.

The package works without them (every kernel has a pure-Python twin), so a machine
without a C compiler still installs; the build prints why the extension was skipped.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Compile the native kernels, but never fail the install because of them."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler problem means "no extension"
            print(f"statebackend: native kernels not built ({exc}); pure-Python twins will be used",
                  file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"statebackend: native kernel {ext.name} not built ({exc}); "
                  "pure-Python twins will be used", file=sys.stderr)


setup(
    ext_modules=[
        Extension(
            "statebackend._native",
            sources=["native/statebackend_native.c"],
            extra_compile_args=["-O3", "-std=c99"],
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
