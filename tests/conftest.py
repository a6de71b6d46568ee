"""Shared fixtures: the storage every study test runs on (SQLite and PostgreSQL), fresh study
names, the remote-code cache of the transformers tests; the product's long functions named at
the end of a run (``tests.helpers.sizes``: a smell to review, never a failure)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import workers  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from tests.helpers.cluster import free_port, start_node, stop_node
from tests.helpers.sizes import LONG_FUNCTION, long_functions, product_modules
from tests.helpers.storage import postgres_url

# --- one Ray per test process for the searches run in it --------------------------------------

_LOCAL_RAY_STARTS: list[str] = []  # tests that started a Ray of their own in this process


def pytest_configure(config: pytest.Config) -> None:
    """Record every ``ray.init`` that starts a local instance in a test process (no address):
    a local Ray started and shut down in the process left the node's next in-process search
    with every trial's actor cancelled before it ran (a flaky failure of later tests)."""
    import functools

    try:
        import ray
    except ImportError:  # the GPU image runs the model tests without Ray (bench.gpu)
        return
    init = ray.init

    @functools.wraps(init)
    def recording(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("address") is None and not os.environ.get("RAY_ADDRESS"):
            _LOCAL_RAY_STARTS.append(os.environ.get("PYTEST_CURRENT_TEST", "?"))
        return init(*args, **kwargs)

    setattr(ray, "init", recording)  # noqa: B010  (mypy: a wrapper of the same call)


@pytest.fixture(autouse=True)
def _in_process_searches_join_the_node() -> Iterator[None]:
    """A test that runs a search in its own process joins the process's node (``shared_ray``),
    or fails here, by name, instead of breaking the tests that run after it."""
    before = len(_LOCAL_RAY_STARTS)
    yield
    if len(_LOCAL_RAY_STARTS) > before:
        pytest.fail(f"{_LOCAL_RAY_STARTS[-1]} started a local Ray in the test process; an "
                    "in-process search must use the shared_ray fixture", pytrace=False)


@pytest.fixture(scope="session")
def shared_ray(ray_cluster: dict[str, str]) -> Iterator[None]:
    """Every in-process search of this test process (an xdist worker) joins the process's one
    Ray node (``ray_cluster``), as the subprocess searches that need no Ray of their own do:
    ``ray.init``'s start of a local instance (~6 s) is paid once per worker, and no second
    instance idles beside the first. The searches' ``tune.session`` leaves it running."""
    import ray

    from workers.search import tune

    tune.start(ray_cluster["RAY_ADDRESS"])
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict[str, str]]:
    """One ``ray start`` node per test process, of its share of this machine's CPUs, for its
    in-process searches (``shared_ray``) and those run in a subprocess that need no Ray of
    their own: a driver that joins it (``RAY_ADDRESS``, the environment
    yielded) skips ``ray.init``'s start and ``ray.shutdown``'s stop of a local instance, 5 of
    the 21 CPU-seconds of a smoke search on 2 cores (measured). A test that watches Ray's
    processes stop with its driver, finds files in Ray's temp dir or hooks the trials' workers
    through their environment keeps a Ray of its own (no ``ray=``): a joined node's workers
    get the node's environment, not the driver's."""
    root = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # socket paths under 108 bytes
    # No token: a test process imports Ray (and reads its auth mode) before the node exists;
    # the node listens on 127.0.0.1 only. tests/test_cluster.py runs its nodes with a token.
    port, auth = free_port(), {"RAY_AUTH_MODE": "disabled"}
    # The worker's share of the cores: the suite's workers run side by side on this machine,
    # so a search here runs as many trials at once as its share allows (measured on 2 cores:
    # a smoke search on a node of 1 CPU took 15 CPU-seconds against 17.6 on 2, one trial
    # actor importing torch instead of two, in the same wall time).
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = max(1, (os.cpu_count() or 1) // processes)
    start_node(root, auth, cpus=share, head_port=port)
    try:
        yield {"RAY_ADDRESS": f"127.0.0.1:{port}", **auth}
    finally:
        stop_node(root)
        shutil.rmtree(root, ignore_errors=True)


# --- storage fixtures: every study test runs on SQLite and on PostgreSQL ----------------------

@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'studies.db'}"
    return postgres_url()


@pytest.fixture
def study_name() -> Iterator[str]:
    """A fresh study name (PostgreSQL tests share one database)."""
    yield f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def remote_code_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``trust_remote_code`` modules go to a temporary folder, not
    ``~/.cache/huggingface/modules``: transformers reads ``HF_MODULES_CACHE`` once, at import,
    into ``dynamic_module_utils``."""
    import sys

    from transformers import dynamic_module_utils

    def forget_modules() -> None:
        """A remote model's relative import (its attention file) goes through the package
        ``transformers_modules``: it must be imported from this module's cache, not the last."""
        for name in [n for n in sys.modules if n.split(".")[0] == "transformers_modules"]:
            del sys.modules[name]

    cache = tmp_path_factory.mktemp("hf_modules")
    forget_modules()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_MODULES_CACHE", str(cache))
        patch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(cache))
        yield cache
    forget_modules()
    if str(cache) in sys.path:  # transformers appends it to import the modules
        sys.path.remove(str(cache))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the product's functions over ``LONG_FUNCTION`` lines, for review; the run's result
    is not touched."""
    found = long_functions(product_modules())
    if found:
        terminalreporter.write_sep("-", f"functions over {LONG_FUNCTION} lines (to review: "
                                        "one job each?)")
        for line in found:
            terminalreporter.write_line(line)
