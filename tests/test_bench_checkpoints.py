"""bench.checkpoint_memory and bench.generate_speed run at smoke size: every stage measured,
the student's KV cache smaller than its teacher's; nothing timed is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.checkpoint_memory import main as memory_main
from bench.generate_speed import main as generate_main


def test_checkpoint_memory_smoke_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert memory_main(["--smoke-test", "--dir", str(tmp_path), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for stage in ("load", "profile", "compress"):
        assert result[f"{stage}_peak_anon_bytes"] > result["baseline_anon_bytes"] > 0
        assert result[f"{stage}_seconds"] > 0
    assert (tmp_path / "student" / "config.json").is_file()


@pytest.mark.usefixtures("remote_code_cache")
def test_generate_speed_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate_main(["--smoke-test", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["student_kv_cache_bytes"] <= result["teacher_kv_cache_bytes"] // 2
    assert result["teacher_decode_tokens_per_s"] > 0 and result["student_decode_tokens_per_s"] > 0
