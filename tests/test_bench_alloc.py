"""bench.alloc_bench: the DP, the milp formulation and brute force agree."""

from __future__ import annotations

import json

import pytest


def test_benchmark_smoke_agrees_with_milp_and_brute_force(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.alloc_bench import main as bench_main

    assert bench_main(["--smoke-test", "--repeat", "1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(row["same_objective"] for row in data["instances"])
