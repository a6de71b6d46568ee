"""bench.throughput runs at smoke size and compares every kind with PyTorch's layer."""

from __future__ import annotations

import json

import pytest

from bench.throughput import KINDS, main


def test_smoke_run_reports_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke-test", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    names = [r["variant"] for r in rows]
    assert names[0] == "torch TransformerEncoderLayer" and set(KINDS) <= set(names)
    assert all(r["tokens_per_s"] > 0 for r in rows)
    by_name = {r["variant"]: r for r in rows}
    # Equal size: PyTorch's layer differs only by our LayerNorm biases (2 per block).
    assert by_name["mhsa"]["total_params"] - rows[0]["total_params"] == 2 * 64
