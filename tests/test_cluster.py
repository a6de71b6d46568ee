"""A real two-node Ray cluster on this machine (``ray start --head`` + ``ray start --address``,
each node with its own CPU and temp dir, token authentication on), a search with ``--address``
and PostgreSQL storage: trials run on both nodes and all land in the one study."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers.cluster import auth_env, free_port, start_node, stop_node
from tests.helpers.search import SMOKE, run
from tests.helpers.storage import postgres_url


@pytest.fixture
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """Head and worker nodes with one CPU each; yields (address, the nodes' environment)."""
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    port, auth = free_port(), auth_env()
    try:
        start_node(root / "h", auth, cpus=1, head_port=port)
        start_node(root / "w", auth, cpus=1, join=f"127.0.0.1:{port}")
        yield f"127.0.0.1:{port}", {**os.environ, **auth}
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
