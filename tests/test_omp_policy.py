"""``workers`` sets OpenMP's passive wait policy before torch loads (libgomp reads it once, at
load), and keeps a policy the user set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A fresh interpreter: the package's __init__ runs before any of its modules imports torch.
CHILD = """
import os, sys
assert "torch" not in sys.modules
import workers.models.model  # imports torch through the package
assert "torch" in sys.modules
print(os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_torch_loads_under_the_passive_policy_unless_the_user_set_one(
        given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.strip() == expected
