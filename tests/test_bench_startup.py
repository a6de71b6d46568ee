"""bench.startup runs at smoke size: every case is timed and profiled, nothing timed is asserted."""

from __future__ import annotations

import json

import pytest

from bench.startup import main


def test_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke-test", "--format", "json"]) == 0
    rows = {r["command"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == ["alloc.solve --help", "studies --help", "studies list", "studies best",
                          "python (no command)"]
    for row in rows.values():
        assert row["wall_s"] > 0 and 0 <= row["ours_import_ms"] <= row["all_import_ms"]
    assert rows["alloc.solve --help"]["heavy"] == []
    assert rows["studies best"]["heavy"] == ["optuna"]  # what it reads the study with
    assert rows["python (no command)"]["ours_import_ms"] == 0
