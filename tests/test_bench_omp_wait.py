"""bench.omp_wait runs at smoke size: each policy in its own process, cores free and busy."""

from __future__ import annotations

import json

import pytest

from bench.omp_wait import main


def test_smoke_run_measures_both_policies_with_the_cores_free_and_busy(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke-test", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and rows[0]["machine"] == "cores free"
    assert rows[1]["machine"] == "1 busy process beside it"  # the smoke's; full size: every core
    for r in rows:
        assert r["active"] > 0 and r["passive"] > 0
        assert r["passive_over_active"] == pytest.approx(r["passive"] / r["active"])
