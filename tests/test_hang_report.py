"""A search subprocess that hangs fails its test with every thread's stack and is killed with
its process group (tests/helpers/search.py's ``finish``): a hang names where it waited, and no
hung driver keeps the node's CPUs from the tests after it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.search import finish

HANGS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
def waits_on_purpose():
    time.sleep(120)
waits_on_purpose()
"""


def test_a_hang_fails_with_its_stacks_and_leaves_no_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HANGS], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    with pytest.raises(AssertionError) as failed:
        finish(proc, timeout=1)
    message = str(failed.value)
    assert "no exit within 1 s" in message
    assert "waits_on_purpose" in message  # the fault handler's stack of the waiting thread
    assert proc.poll() is not None
    deadline = time.monotonic() + 30  # SIGKILL lands asynchronously (slowly on a busy machine)
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(child)  # the group went with it


def running(pid: int) -> bool:
    """The process exists and is not a zombie (here nothing may reap an orphan)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_search_that_exits_gives_its_output() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "print('done')"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert finish(proc, timeout=60) == ("done\n", "")
