"""Models, tasks, training and the Ray Tune search: the only package that imports torch and Ray."""

import os

# torch's OpenMP threads spin while they wait for one another. On a machine whose cores are
# busy (a search's trials beside a pilot, two commands at once) a spinning thread holds the core
# its partner needs, and a small model trains 40x slower (a 300-step pilot on this project's
# 2-core box beside a search: 208 s, against 5 s waiting passively; docs/benchmarks.md).
# libgomp reads this when torch loads, so it is set before any module of this package imports
# torch; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
