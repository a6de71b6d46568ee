"""Ray nodes started with ``ray start`` for the tests: one on a port of its own, in a temp dir
of its own, with token authentication, stopped by killing exactly its processes."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def auth_env() -> dict[str, str]:
    """The environment of a cluster's nodes and of every driver that joins it: the token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}


def start_node(temp_dir: Path, env: Mapping[str, str], cpus: int,
               head_port: int | None = None, join: str | None = None) -> None:
    """``ray start --head --port HEAD_PORT`` or ``ray start --address JOIN``, on 127.0.0.1."""
    where = [f"--address={join}"] if join else ["--head", f"--port={head_port}",
                                                "--include-dashboard=false"]
    subprocess.run(["ray", "start", *where, "--node-ip-address=127.0.0.1",
                    f"--temp-dir={temp_dir}", f"--num-cpus={cpus}", "--disable-usage-stats"],
                   env={**os.environ, **env}, check=True, capture_output=True, timeout=120)


def node_pids(temp_dir: Path) -> list[int]:
    """Processes started for the node whose temp dir is ``temp_dir`` and their descendants (the
    agents rename themselves ``ray::DashboardAgent``: their command lines name no temp dir).
    Never ``ray stop``, which would stop every Ray instance on the machine."""
    named, parents = set(), {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if str(temp_dir) in cmdline:
                named.add(int(entry.name))
    found, grown = set(named), True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grown = bool(children)
    return sorted(found)


def stop_node(temp_dir: Path) -> None:
    """SIGKILL: after SIGTERM gcs_server can hang for minutes (seen with Ray 2.60)."""
    for pid in node_pids(temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while node_pids(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not node_pids(temp_dir), "Ray processes of the test cluster survived SIGKILL"
