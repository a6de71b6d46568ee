"""``bench.doc_times`` finds every time the README and the guides state: each command's comment
and each sentence of ``PROSE``, whose words the pages must still hold."""

from __future__ import annotations

from bench import doc_times
from bench.doc_times import PROSE, Statement, Took


def test_every_stated_time_is_found_with_its_commands() -> None:
    found, stated = doc_times.statements("")
    said = [s.says for s in stated if s.says]
    assert said == [p.says for p in PROSE]  # every sentence is still on its page
    for s in stated:
        commands = found[s.where]
        assert s.timed and all(commands[i][0].startswith("python -m ") for i in s.timed)
        if not s.says:  # a comment's: the one command it follows
            assert len(s.timed) == 1 and commands[s.timed[0]][1] == s.stated_s
    assert any(s.where.startswith("README.md") and "--smoke-test" in found[s.where][s.timed[0]][0]
               and "workers.search" in found[s.where][s.timed[0]][0] for s in stated)


def test_times_taken_add_up_and_a_row_judges_within_one_and_a_half() -> None:
    a, b = Took(0, 10.0, 15.0, (1.0, 2.0)), Took(3, 5.0, 4.0, (2.5, 0.5))
    assert a + b == Took(3, 15.0, 19.0, (1.0, 0.5))
    statement = Statement("README.md:1", (0, 1), 12.0, "in all")
    commands: doc_times.Block = [("python -m a", None), ("python -m b", None)]
    row = doc_times.row(statement, commands, [a, Took(0, 5.0, 4.0, (2.0, 3.0))])
    assert row["measured_s"] == 15.0 and row["ratio"] == 1.25 and row["holds"] is True
    assert row["load"] == "1.0-3.0" and row["command"] == "python -m a && python -m b"
    assert doc_times.row(statement, commands, [a, b])["holds"] is False  # exit 3
    assert doc_times.row(statement, commands, None)["holds"] is None  # not run


def test_a_comment_states_seconds_minutes_or_both() -> None:
    said = {text: doc_times.stated_seconds(m) for text in (
        "cmd  # ~15 s", "cmd  # two pilots: ~1.5 min for 1 MB", "cmd  # ~3 min 30 s",
        "cmd  # ~1 h 10 min on 2 cores") if (m := doc_times.STATED.search(text))}
    assert list(said.values()) == [15.0, 90.0, 210.0, 4200.0]
    assert doc_times.STATED.search("cmd  # seconds") is None
