"""Test fixtures: a real `kiln serve` on a free loopback port with a temporary data
directory (never a mock).

The binary is `KILN_BIN`, else `<repo>/target/release/kiln`, built with cargo if
missing.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import httpx
import pytest

from kiln_client import DocumentStore

REPO = Path(__file__).resolve().parents[3]


def kiln_bin() -> str:
    env = os.environ.get("KILN_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise RuntimeError(f"KILN_BIN={env} is not an executable file")
        return env
    path = REPO / "target" / "release" / "kiln"
    if not path.exists():
        cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        print(f"building {path} (cargo build --release -p kiln-cli)...", file=sys.stderr)
        subprocess.run([cargo, "build", "--release", "-p", "kiln-cli"], cwd=REPO, check=True)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KilnServer:
    """One `kiln serve` process."""

    def __init__(self, data_dir: Optional[str] = None, extra: Optional[List[str]] = None,
                 port: Optional[int] = None, tls: Optional[Dict[str, str]] = None) -> None:
        self.bin = kiln_bin()
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="kiln-py-test-")
        self.extra = list(extra or [])
        self.port = port or free_port()
        self.tls = tls
        self.proc: Optional[subprocess.Popen] = None
        fd, self.log_path = tempfile.mkstemp(prefix="kiln-serve-", suffix=".log")
        os.close(fd)
        self.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> None:
        args = [self.bin, "serve", "--data-dir", self.data_dir,
                "--bind", f"127.0.0.1:{self.port}", *self.extra]
        if self.tls:
            args += ["--tls-cert", self.tls["cert"], "--tls-key", self.tls["key"]]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        verify = ssl.create_default_context(cafile=self.tls["cert"]) if self.tls else True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited ({self.proc.returncode}): "
                                   f"{Path(self.log_path).read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", verify=verify, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"kiln serve did not answer /health within {timeout} s")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def restart(self) -> None:
        self.kill()
        self.start()

    def metrics(self, api_key: Optional[str] = None) -> str:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        verify = ssl.create_default_context(cafile=self.tls["cert"]) if self.tls else True
        return httpx.get(f"{self.url}/metrics", headers=headers, verify=verify).text


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of a Prometheus metric whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(4))
    return total


DOC_ROUTE = "/dbs/{db}/docs/{*id}"


def requests_to(text: str, route: str = DOC_ROUTE, method: str = "GET",
                status: Optional[str] = None) -> float:
    labels = {"route": route, "method": method}
    if status is not None:
        labels["status"] = status
    return metric(text, "kiln_http_requests_total", **labels)


@pytest.fixture(scope="session")
def server() -> Iterator[KilnServer]:
    s = KilnServer()
    yield s
    s.stop()
    shutil.rmtree(s.data_dir, ignore_errors=True)


@pytest.fixture()
def db_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture()
def store(server: KilnServer, db_name: str) -> Iterator[DocumentStore]:
    st = DocumentStore(server.url, db_name)
    st.create_database()
    yield st
    # Each database preallocates its data and journal files (~190 MB on disk):
    # dropped after its test so the suite's footprint stays that of a few.
    try:
        st.delete_database()
    except Exception:
        pass
    st.close()
