"""Fixtures: a real `muster dev` cluster (three replicas, four agents with
eight fake GPUs each) started once per test session.

$MUSTER_BIN names the binary (default: target/debug/muster of this repo).
Nothing waits on a fixed sleep: every wait polls with a deadline.
"""

from __future__ import annotations

import os

# Quiet gRPC C-core's handshake-failure logs in the tests that provoke them.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from muster_client import Client, MusterError, node_status_name

HERE = Path(__file__).resolve().parent
PACKAGE_ROOT = HERE.parent  # clients/python
REPO_ROOT = PACKAGE_ROOT.parent.parent

#: Generous: the CI machine is small and busy.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
EXPECTED_NODES = 4

_REPLICAS = re.compile(r"^\s*replicas\s+(\S+)\s*$")
_TLS = re.compile(r"^\s*tls\s+(.+?) \(mutual TLS; you are ([\w.-]+)\)\s*$")


def muster_bin() -> Path:
    """$MUSTER_BIN, else target/debug/muster of this repository."""
    env = os.environ.get("MUSTER_BIN")
    return Path(env).resolve() if env else REPO_ROOT / "target" / "debug" / "muster"


@dataclass
class DevCluster:
    """A running `muster dev`: its replicas, TLS dir and admin identity."""

    proc: subprocess.Popen[str]
    addresses: list[str] = field(default_factory=list)
    tls_dir: str = ""
    identity: str = ""
    output: list[str] = field(default_factory=list)

    def tail(self, n: int = 40) -> str:
        return "".join(self.output[-n:])

    def client(self, **kwargs: object) -> Client:
        args: dict[str, object] = {
            "addresses": self.addresses,
            "tls_dir": self.tls_dir,
            "identity": self.identity,
            "timeout": 20.0,
        }
        args.update(kwargs)
        return Client(**args)  # type: ignore[arg-type]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    binary = muster_bin()
    if not binary.is_file():
        pytest.fail(f"no muster binary at {binary}: build it (cargo build -p muster-cli) or set MUSTER_BIN")
    data = tmp_path_factory.mktemp("muster-dev")
    proc = subprocess.Popen(
        [str(binary), "dev", "--data-dir", str(data)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,  # a terminal's Ctrl-C reaches pytest only; the fixture stops it
    )
    cluster = DevCluster(proc=proc)
    ready = threading.Event()

    def read() -> None:
        # Drains stdout for the cluster's whole life so it never blocks on a full pipe.
        assert proc.stdout is not None
        for line in proc.stdout:
            cluster.output.append(line)
            if m := _REPLICAS.match(line):
                cluster.addresses = m.group(1).split(",")
            elif m := _TLS.match(line):
                cluster.tls_dir, cluster.identity = m.group(1), m.group(2)
            if cluster.addresses and cluster.tls_dir:
                ready.set()
        ready.set()  # the process ended: wake the waiter

    reader = threading.Thread(target=read, name="muster-dev-stdout", daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        if not ready.wait(START_TIMEOUT_S) or not (cluster.addresses and cluster.tls_dir):
            pytest.fail(f"muster dev did not print its replicas and TLS dir:\n{cluster.tail()}")
        with cluster.client(timeout=10.0) as c:
            seen: str = "nothing yet"
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"muster dev exited with {proc.returncode}:\n{cluster.tail()}")
                try:
                    nodes = c.nodes()
                    ready_nodes = [n for n in nodes if node_status_name(n.status) == "ready"]
                    if len(ready_nodes) == EXPECTED_NODES:
                        break
                    seen = ", ".join(f"{n.id} {node_status_name(n.status)}" for n in nodes) or "no nodes"
                except MusterError as e:
                    seen = str(e)
                if time.monotonic() > deadline:
                    pytest.fail(f"{EXPECTED_NODES} ready nodes not seen in {START_TIMEOUT_S} s ({seen}):\n{cluster.tail()}")
                time.sleep(0.2)
        yield cluster
    finally:
        _stop(proc)
        reader.join(timeout=5)


@pytest.fixture(scope="session")
def client(dev: DevCluster) -> Iterator[Client]:
    with dev.client() as c:
        yield c
