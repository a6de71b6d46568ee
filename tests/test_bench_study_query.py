"""bench.study_query runs at smoke size on SQLite; its concurrent queries hold one connection
each."""

from __future__ import annotations

import json

import pytest

from bench.study_query import main


def test_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke-test", "--postgres", "", "--repeat", "1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["writers"] for r in data["throughput"]] == [1, 2]
    assert all(r["trials_per_s"] > 0 for r in data["throughput"])
    (row,) = data["queries"]
    assert row["trials"] == 100 and row["ours_best_s"] > 0
    (crowd,) = data["concurrent"]  # four query commands at once, each on one connection
    assert (crowd["queries"], crowd["exit_0"], crowd["most_open_per_process"]) == (4, 4, 1)
    assert crowd["most_made_per_process"] == 1 and crowd["errors"] == []
