"""Builds libgd2fs.so.1 with the Go toolchain while building the package.

pip install --no-build-isolation ./python   (offline; Debian's pip and setuptools)
python3 -m build --wheel --no-isolation python   (a wheel bundling the library)

The version is gd2fs's (internal/version/VERSION, the number `gd2fs --version`
prints); the build writes it into pygd2fs/_version.py, and stamps the
library's Go build with the commit as scripts/image.sh does.
"""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def gd2fs_version() -> str:
    with open(os.path.join(REPO, "internal", "version", "VERSION")) as f:
        return f.read().strip()


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class BuildWithGo(build_py):
    def run(self):
        super().run()
        out = os.path.join(os.path.abspath(self.build_lib), "pygd2fs", "libgd2fs.so.1")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1")
        ldflags = "-X github.com/gd2fs/gd2fs/internal/version.commit=" + commit()
        subprocess.run(["go", "build", "-buildmode=c-shared", "-ldflags", ldflags, "-o", out, "./python/capi"],
                       cwd=REPO, env=env, check=True)
        header = out[: -len(".1")] + ".h"  # go names it after the output, less its last extension
        if os.path.exists(header):
            os.remove(header)
        with open(os.path.join(os.path.dirname(out), "_version.py"), "w") as f:
            f.write(f'"""Written by setup.py: the gd2fs version this package was built from."""\n\nversion = "{gd2fs_version()}"\n')


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(version=gd2fs_version(), cmdclass={"build_py": BuildWithGo}, distclass=BinaryDistribution)
