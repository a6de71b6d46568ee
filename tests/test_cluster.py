"""A real two-node Ray cluster on this machine (``ray start --head`` + ``ray start --address``,
each node with its own CPU and temp dir, token authentication on), a search with ``--address``
and PostgreSQL storage: trials run on both nodes and all land in the one study."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers.search import SMOKE, run
from tests.helpers.storage import postgres_url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_pids(temp_dir: Path) -> list[int]:
    """Processes started for the node whose temp dir is ``temp_dir`` (never ``ray stop``, which
    would stop every Ray instance on the machine)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(temp_dir) in cmdline:
                pids.append(int(entry.name))
    return pids


def stop_node(temp_dir: Path) -> None:
    """SIGKILL: after SIGTERM gcs_server can hang for minutes (seen with Ray 2.60)."""
    for pid in node_pids(temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while node_pids(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not node_pids(temp_dir), "Ray processes of the test cluster survived SIGKILL"


@pytest.fixture
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """Head and worker nodes with one CPU each; yields (address, the nodes' environment)."""
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run(["ray", "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                        f"--temp-dir={root}/h", "--include-dashboard=false", *common], env=env,
                       check=True, capture_output=True, timeout=120)
        subprocess.run(["ray", "start", f"--address=127.0.0.1:{port}",
                        "--node-ip-address=127.0.0.1", f"--temp-dir={root}/w", *common], env=env,
                       check=True, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}", env
    finally:
        stop_node(root / "w")
        stop_node(root / "h")


def test_search_runs_on_both_nodes_into_one_study(cluster: tuple[str, dict[str, str]],
                                                  tmp_path: Path, study_name: str) -> None:
    url = postgres_url()
    address, env = cluster
    proc = run(tmp_path, *SMOKE, "--storage", url, "--study", study_name, "--trials", "4",
               "--scheduler", "fifo", "--steps", "400", "--max-concurrent", "2",
               "--address", address, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = optuna.load_study(study_name=study_name, storage=url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4  # long enough to overlap
    assert len({t.user_attrs["node"] for t in trials}) == 2
