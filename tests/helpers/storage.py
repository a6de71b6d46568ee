"""The PostgreSQL database of the storage-parametrised tests (``TEST_POSTGRES_URL``)."""

from __future__ import annotations

import os

import pytest

PG_ENV = "TEST_POSTGRES_URL"


def postgres_url() -> str:
    """The PostgreSQL URL of the tests: fail in CI if unusable, skip with the reason elsewhere."""
    import sqlalchemy

    url = os.environ.get(PG_ENV)
    in_ci = os.environ.get("CI") == "true"
    if not url:
        reason = (f"{PG_ENV} is not set (e.g. postgresql://postgres@127.0.0.1:5432/test); "
                  ".ci/run sets it")
        pytest.fail(reason) if in_ci else pytest.skip(reason)
    try:
        with sqlalchemy.create_engine(url).connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as err:
        reason = f"PostgreSQL at {PG_ENV} is unreachable: {str(err).splitlines()[0]}"
        pytest.fail(reason) if in_ci else pytest.skip(reason)
    return url
