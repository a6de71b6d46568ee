"""Output files: written whole or not at all, with the user's permissions, and YAML read with
bounds (no aliases, a size limit)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import yaml

from common.files import MAX_YAML_CHARS, load_yaml, read_yaml, write_atomic, write_csv


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_take_the_users_umask(umask: int, tmp_path: Path) -> None:
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary left


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text("old")
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "out.txt", 42)  # type: ignore[arg-type]
    assert (tmp_path / "out.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_yaml_is_read_within_bounds(tmp_path: Path) -> None:
    assert load_yaml("a: &x 1\nb: 2\n") == {"a": 1, "b": 2}  # an anchor alone is harmless
    with pytest.raises(yaml.YAMLError, match="line 2: aliases"):
        load_yaml("a: &x 1\nb: *x\n")
    with pytest.raises(yaml.YAMLError, match="at most"):
        load_yaml("#" * (MAX_YAML_CHARS + 1))
    (tmp_path / "big.yaml").write_bytes(b"#" * (4 * MAX_YAML_CHARS + 1))
    with pytest.raises(yaml.YAMLError, match="bytes; at most"):
        read_yaml(tmp_path / "big.yaml")
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']")  # still a safe loader


def test_what_we_write_we_read_even_with_shared_objects() -> None:
    from common.files import dump_yaml

    layer = {"attention": "mhsa", "heads": ["2x8"]}
    data = {"layers": [layer, layer]}  # PyYAML's safe_dump would write an alias here
    assert "*" not in dump_yaml(data) and load_yaml(dump_yaml(data)) == data


def test_a_table_keeps_every_rows_columns(tmp_path: Path) -> None:
    """Rows with different columns (a corpus measured on 3 seeds beside one on 5): every
    column is written, in the order it first appears, and a row without it leaves it empty."""
    rows = [{"corpus": "code", "loss_seed0": 1.0}, {"corpus": "stubs", "loss_seed0": 2.0,
                                                    "loss_seed4": 3.0}]
    write_csv(tmp_path / "t.csv", rows)
    with (tmp_path / "t.csv").open() as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == ["corpus", "loss_seed0", "loss_seed4"]
    assert back == [{"corpus": "code", "loss_seed0": "1.0", "loss_seed4": ""},
                    {"corpus": "stubs", "loss_seed0": "2.0", "loss_seed4": "3.0"}]
