"""A real gd2fs cluster on loopback for the Python tests and benchmarks:
one `gd2fs master` process and N `gd2fs server` processes on ephemeral
ports, data in a temporary directory. Servers are separate processes so a
test can kill one (SIGKILL) in the middle of a transfer."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gd2fs_binary() -> str:
    """$GD2FS_BIN, else bin/gd2fs built from this checkout."""
    env = os.environ.get("GD2FS_BIN")
    if env:
        return env
    out = os.path.join(REPO, "bin", "gd2fs")
    subprocess.run(["go", "build", "-o", out, "./cmd/gd2fs"], cwd=REPO, check=True)
    return out


def _wait_line(path: str, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            m = rx.search(f.read())
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(path, errors="replace") as f:
        log = f.read()
    raise RuntimeError(f"gd2fs process did not print {pattern!r} (exit {proc.poll()}):\n{log}")


class Cluster:
    """Start with ``Cluster(...).start()``; stop with ``stop()``."""

    def __init__(self, servers: int = 3, name: str = "pytest", token: str = "", mem: str = "256MiB",
                 kv_mem: str = "64MiB", binary: Optional[str] = None, master_args: Optional[List[str]] = None):
        self.n = servers
        self.name = name
        self.token = token
        self.mem = mem
        self.kv_mem = kv_mem
        self.bin = binary or gd2fs_binary()
        self.master_args = list(master_args or [])
        self.dir = tempfile.mkdtemp(prefix="pygd2fs-")
        self.master_url = ""
        self.master: Optional[subprocess.Popen] = None
        self.servers: List[subprocess.Popen] = []
        self.server_addrs: List[str] = []

    @property
    def hostport(self) -> str:
        return self.master_url.split("://", 1)[1]

    @property
    def cpaddr(self) -> str:
        """The master as the engines' backends give it: gd2fs://host:port."""
        return "gd2fs://" + self.hostport

    def _spawn(self, name: str, args: List[str]) -> tuple:
        log = os.path.join(self.dir, name + ".log")
        env = dict(os.environ)
        if self.token:
            env["GD2FS_TOKEN"] = self.token
        p = subprocess.Popen([self.bin] + args, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                             env=env, start_new_session=True)
        return p, log

    def start(self) -> "Cluster":
        try:
            self.master, log = self._spawn("master", [
                "master", "--listen", "127.0.0.1:0", "--meta", f"sqlite://{self.dir}/meta.db",
                "--cluster", self.name, "--down-after", "2s", "--repair-after", "-1s"] + self.master_args)
            self.master_url = _wait_line(log, r"gd2fs master on (http://\S+)", self.master).group(1)
            for i in range(self.n):
                self.add_server()
            self.wait_up(self.n)
            return self
        except BaseException:
            self.stop()
            raise

    def add_server(self) -> str:
        i = len(self.servers)
        p, log = self._spawn(f"server-{i}", [
            "server", "--master", self.master_url, "--listen", "127.0.0.1:0", "--id", f"server-{i}",
            "--mem", self.mem, "--kv-mem", self.kv_mem, "--heartbeat", "200ms"])
        self.servers.append(p)
        addr = _wait_line(log, r"gd2fs server \S+ on (\S+)", p).group(1)
        self.server_addrs.append(addr)
        return addr

    def status(self) -> dict:
        req = urllib.request.Request(self.master_url + "/v1/status")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    def wait_up(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                st = self.status()
                if sum(1 for s in st.get("servers") or [] if s.get("state") == "up") >= n:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{n} servers did not come up")

    def kill_server(self, i: int) -> None:
        p = self.servers[i]
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()

    def stop(self) -> None:
        for p in self.servers + ([self.master] if self.master else []):
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
