"""Fixtures: a real gd2fs cluster (master + 3 server processes on loopback)
shared by the tests of a session, and clients of it."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)

from gd2fs_cluster import REPO, Cluster, gd2fs_binary  # noqa: E402

LIB = os.environ.get("GD2FS_LIBRARY") or os.path.join(PYDIR, "pygd2fs", "libgd2fs.so.1")
if not os.path.exists(LIB):
    subprocess.run(["make", "-C", PYDIR, "lib"], check=True)


@pytest.fixture(scope="session")
def binary():
    return gd2fs_binary()


@pytest.fixture(scope="session")
def cluster(binary):
    c = Cluster(binary=binary).start()
    yield c
    c.stop()


@pytest.fixture
def client(cluster):
    import pygd2fs

    c = pygd2fs.Client(cluster.cpaddr, "tcp://127.0.0.1", cluster.name, iothreads=4, memthreads=1, streams=2)
    yield c
    c.Close()


@pytest.fixture
def conn(cluster):
    import pygd2fs

    c = pygd2fs.connect(cluster.master_url)
    yield c
    c.close()
