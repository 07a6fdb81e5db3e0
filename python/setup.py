"""Builds libgd2fs.so.1 with the Go toolchain while building the package.

pip install --no-build-isolation ./python   (offline; Debian's pip and setuptools)
"""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class BuildWithGo(build_py):
    def run(self):
        super().run()
        out = os.path.join(os.path.abspath(self.build_lib), "pygd2fs", "libgd2fs.so.1")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1")
        subprocess.run(["go", "build", "-buildmode=c-shared", "-o", out, "./python/capi"], cwd=REPO, env=env, check=True)
        header = out[: -len(".1")] + ".h"  # go names it after the output, less its last extension
        if os.path.exists(header):
            os.remove(header)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithGo}, distclass=BinaryDistribution)
