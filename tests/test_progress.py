"""Progress on stderr (``common.progress``): a bar on a terminal, one plain line per event
otherwise, nothing when quiet; and the long commands that use it, run with stderr captured (not
a terminal): one line per event, never a bar's carriage-return redraws, nothing with --quiet."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from common.progress import Progress, duration, say


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_steps(stream: io.StringIO, quiet: bool = False) -> None:
    with Progress("train", total=20, unit="steps", start="training a model", quiet=quiet,
                  stream=stream) as bar:
        for step in range(1, 21):
            bar.update(1, loss=f"{1 / step:.3g}")
            if step % 5 == 0:
                bar.event(f"evaluation at step {step}")


def test_a_terminal_gets_a_bar() -> None:
    stream = Terminal()
    run_steps(stream)
    text = stream.getvalue()
    assert text.startswith("train: training a model\n")
    assert "\r" in text and "20/20" in text and "loss=" in text  # tqdm's redrawn bar
    assert "evaluation at step 20" in text  # the last event, on the bar


def test_a_log_gets_one_line_per_event() -> None:
    stream = io.StringIO()
    run_steps(stream)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert len(lines) == 1 + 4 + 1  # start, one per event, end
    assert lines[0] == "train: training a model"
    assert lines[1].startswith("train: 5/20 steps (25%); evaluation at step 5; loss=0.2; ")
    assert "elapsed" in lines[1] and "left" in lines[1]  # time spent and time left
    assert lines[4].startswith("train: 20/20 steps (100%)") and "left" not in lines[4]
    assert lines[5].startswith("train: done, 20/20 steps in ")


def test_quiet_prints_nothing() -> None:
    for stream in (io.StringIO(), Terminal()):
        run_steps(stream, quiet=True)
        say("a phase starts", quiet=True, stream=stream)
        assert stream.getvalue() == ""


def test_an_error_inside_leaves_no_end_line() -> None:
    """Leaving by an exception prints nothing more (the error that follows stands alone)."""
    for stream in (io.StringIO(), Terminal()):
        with pytest.raises(ValueError), Progress("read", total=3, stream=stream) as bar:
            bar.update(1)
            raise ValueError("bad input")
        assert "done" not in stream.getvalue()
    stream = io.StringIO()
    with Progress("read", total=3, stream=stream):
        pass
    assert stream.getvalue() == "read: done, 0/3 it in 0.0 s\n"


def test_the_callers_estimate_replaces_the_rate() -> None:
    stream = io.StringIO()
    with Progress("search", total=10, unit="trials", stream=stream) as bar:
        bar.update(1)
        bar.event("1 complete", eta=3 * 3600 + 60)
    assert "~3 h 01 min left" in stream.getvalue()


@pytest.mark.parametrize(("seconds", "text"), [
    (0.04, "0.0 s"), (8.25, "8.2 s"), (45, "45 s"), (200, "3 min 20 s"),
    (2 * 3600 + 300, "2 h 05 min"), (3 * 86400 + 4 * 3600, "3 d 4 h"),
    (float("nan"), "?")])
def test_durations_read_like_a_person_says_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# --- the commands ------------------------------------------------------------------------------


def arch_file(tmp_path: Path) -> Path:
    from alloc.solve import main as solve_main

    path = tmp_path / "arch.yaml"
    assert solve_main(["--budget", "32", "--layers", "2", "--vocab-size", "64", "--out",
                       str(path), "--product-order", "1", "--format", "json"]) == 0
    return path


def test_train_prints_a_line_per_event_and_nothing_when_quiet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.train import main as train_main

    arch = arch_file(tmp_path)
    capsys.readouterr()
    argv = ["--arch", str(arch), "--task", "lm", "--smoke-test", "--format", "json"]
    assert train_main(argv) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err
    assert lines[0].startswith("lm: training ") and "for 20 steps on cpu" in lines[0]
    # smoke: evaluations every 10 steps, a line every tenth (2 steps) between them
    assert [line.split()[1] for line in lines[1:-1]] == [f"{s}/20" for s in range(2, 21, 2)]
    assert "val_loss=" in lines[5] and lines[-1].startswith("lm: done, 20/20 steps in ")
    assert train_main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_the_pilot_shows_its_steps_then_its_measurement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.profile import main as profile_main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    argv = ["--data", str(corpus), "--pilot-steps", "10", "--budget", "32", "--seq-len", "32",
            "--format", "json"]
    assert profile_main(argv) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err
    assert "pilot: training the baseline at D = 32" in lines[0]
    assert [line.split()[1] for line in lines if line.startswith("pilot: ") and "/10 steps ("
            in line] == [f"{s}/10" for s in range(1, 11)]
    assert "tok_s=" in lines[1] and "left" in lines[1]
    assert any(line.startswith("pilot: done, 10/10 steps") for line in lines)
    assert lines[-2].startswith("pilot: measuring") and lines[-1].startswith("pilot: measured")
    assert profile_main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_checkpoint_profile_counts_the_loss_rules_forwards(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.profile import main as profile_main
    from workers.train import main as train_main

    ckpt = str(tmp_path / "c.pt")
    assert train_main(["--arch", str(arch_file(tmp_path)), "--task", "lm", "--smoke-test",
                       "--out", ckpt, "--quiet", "--format", "json"]) == 0
    capsys.readouterr()
    argv = ["--checkpoint", ckpt, "--task", "lm", "--smoke-test", "--rule", "loss",
            "--align", "4", "--format", "json"]
    assert profile_main(argv) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[0].startswith(f"measure: read {ckpt} (ours, 2 layers")
    assert "measure: 2/2 layers (100%); layer 1" in err
    start = next(line for line in lines if line.startswith("loss rule: one forward"))
    forwards = int(start.split(": ")[-1].split()[0])
    assert forwards > 1 and f"loss rule: done, {forwards}/{forwards} forwards" in err
    assert profile_main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
