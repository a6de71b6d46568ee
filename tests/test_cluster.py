"""A real two-node Ray cluster on this machine (``ray start --head`` + ``ray start --address``,
each node with its own CPU and temp dir, token authentication on), a search with ``--address``
and PostgreSQL storage: trials run on both nodes and all land in the one study; the same for a
student search of a pretrained checkpoint, whose teacher both nodes read from the one cache."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers.cluster import auth_env, free_port, start_node, stop_node
from tests.helpers.llama import build, saved, token_folder
from tests.helpers.search import SMOKE, run
from tests.helpers.storage import postgres_url


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """Head and worker nodes with one CPU each, shared by this file's searches (one after the
    other); yields (address, the nodes' environment)."""
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


def test_a_student_search_runs_on_both_nodes_and_measures_its_teacher_once(
        cluster: tuple[str, dict[str, str]], tmp_path: Path, study_name: str) -> None:
    """A Qwen2 teacher (biases on its projections, two KV heads): the driver measures it once
    into the storage path, which both nodes read; every trial, distilled for a few seconds on
    either node, lands in the one study."""
    pytest.importorskip("transformers")
    url = postgres_url()
    address, env = cluster
    space = tmp_path / "space.yaml"
    space.write_text(json.dumps({"name": "cluster_students", "form": "latent", "seq_len": 16,
                                 "sample_tokens": 128, "eval_tokens": 512, "eval_chunks": 2,
                                 "align": 4, "sampler": "random", "refit_after": 0,
                                 "distil_steps": 500}))  # trials long enough to overlap
    teacher = saved(build("qwen2", num_key_value_heads=2), tmp_path / "teacher")
    tokens = token_folder(tmp_path / "tokens")
    proc = run(tmp_path, "--space", str(space), "--teacher", str(teacher), "--data", str(tokens),
               "--eval", str(tokens), "--kv-cache", "0.25", "--storage", url, "--study",
               study_name, "--trials", "6", "--scheduler", "fifo", "--max-concurrent", "2",
               "--address", address, "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = optuna.load_study(study_name=study_name, storage=url).trials
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 6  # the others: points drawn twice, recorded and not trained
    assert all(t.user_attrs["status"] == "duplicate" for t in trials if t not in done)
    assert len({t.user_attrs["node"] for t in done}) == 2
    caches = [p for p in (tmp_path / "results").rglob("meta.json")]
    assert len(caches) == 1  # measured once, read by both nodes
