"""A storage URL: where it comes from, how it prints, and where its secrets go.

* The URL comes from the argument, else ``$OPTUNA_STORAGE`` (as the ``optuna`` CLI), else the
  SQLite file ``studies.db`` in the working directory (``resolve_url``).
* A URL's secrets are never printed, logged or put in an exception: the user's password
  (``user:pw@``) and the query's ``password``, ``sslpassword`` and ``passfile`` (libpq takes
  them there too). ``redact`` shows each as ``***`` in every message, and driver errors are
  scrubbed of them (``scrub``). ``secure_url`` moves the password into ``$PGPASSWORD`` and the
  password file into ``$PGPASSFILE`` for the drivers built on libpq, before the URL is pickled
  (Ray's state); ``unmask`` turns a printed ``***`` back into ``$PGPASSWORD`` or ``~/.pgpass``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from studies.errors import StorageError

ENV_VAR = "OPTUNA_STORAGE"
DEFAULT_URL = "sqlite:///studies.db"


def resolve_url(url: str | None = None) -> str:
    """The URL to use: the argument, else ``$OPTUNA_STORAGE``, else ``sqlite:///studies.db``."""
    return url or os.environ.get(ENV_VAR) or DEFAULT_URL


def parse(url: str) -> URL:
    """``url`` parsed by SQLAlchemy.

    Raises:
        StorageError: it is not an SQLAlchemy URL (its text is not repeated: it may hold a
            password).
    """
    try:
        return make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StorageError("storage URL is not an SQLAlchemy URL (e.g. sqlite:///studies.db or "
                           "postgresql://user@host/db)") from None


# The libpq connection parameters a URL's query may hold that are, or lead to, a password: a
# password, the password of an SSL key, and the path of a password file (a path that says where
# the secret lives is kept out of every line as well).
SECRET_KEYS = ("password", "sslpassword", "passfile")
MASK = "***"  # what every secret of a printed URL reads as
# The secrets ``secure_url`` can move into libpq's environment (libpq has no variable for an SSL
# key's password: that one stays in the URL, and is only ever printed redacted).
_ENV_OF = {"password": "PGPASSWORD", "passfile": "PGPASSFILE"}
# Letters only, so SQLAlchemy's quoting of a URL leaves it whole (it would write "***" as
# "%2A%2A%2A"): secrets become this token, the URL is rendered, the token becomes MASK.
_TOKEN = "ZZredactedZZ"
SECRET_HINT = "the password is not shown: set $PGPASSWORD or use ~/.pgpass"


@dataclass(frozen=True)
class _Moved:
    """A URL whose secrets ``secure_url`` moved to the environment: how it prints, and them."""

    redacted: str
    secrets: tuple[str, ...]


_MOVED: dict[str, _Moved] = {}  # keyed by the URL secure_url returned


def _parse_quietly(url: str) -> URL | None:
    try:
        return parse(url)
    except StorageError:
        return None


def _values(value: str | tuple[str, ...] | None) -> list[str]:
    """A query parameter's values (SQLAlchemy gives a repeated one as a tuple)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _secrets(parsed: URL) -> list[str]:
    """Every secret ``parsed`` holds, longest first (a secret inside another is found after)."""
    found = [str(parsed.password)] if parsed.password else []
    for key in SECRET_KEYS:
        found += _values(parsed.query.get(key))
    return sorted({s for s in found if s}, key=len, reverse=True)


def _masked(parsed: URL) -> str:
    query = {k: (_TOKEN if k in SECRET_KEYS else v) for k, v in parsed.query.items()}
    hidden = parsed.set(password=_TOKEN if parsed.password else parsed.password, query=query)
    return hidden.render_as_string(hide_password=False).replace(_TOKEN, MASK)


def redact(url: str) -> str:
    """``url`` with every secret replaced by ``***`` (safe to print): the password of its user
    (``user:pw@``) and the query's ``password``, ``sslpassword`` and ``passfile``. A URL that
    ``secure_url`` returned prints as the URL it came from: ``***`` still says it has one."""
    if url in _MOVED:
        return _MOVED[url].redacted
    parsed = _parse_quietly(url)
    return "<unparseable storage URL>" if parsed is None else _masked(parsed)


def has_secret(url: str) -> bool:
    """Whether ``redact(url)`` hides something (its printed form then needs ``SECRET_HINT``)."""
    parsed = _parse_quietly(redact(url))
    return parsed is not None and MASK in (str(parsed.password), *(
        v for key in SECRET_KEYS for v in _values(parsed.query.get(key))))


def command_note(url: str) -> str:
    """What follows a printed command whose ``--storage`` is ``redact(url)``: a shell comment
    saying where the hidden password comes from (nothing when the URL hides none)."""
    return f"  # {SECRET_HINT}" if has_secret(url) else ""


LIBPQ_DRIVERS = ("postgresql", "postgresql+psycopg2", "postgresql+psycopg")


def _last(value: str | tuple[str, ...] | None) -> str | None:
    values = _values(value)
    return values[-1] if values else None


def _rebuilt(parsed: URL, password: str | None, query: Mapping[str, Any]) -> str:
    """``parsed`` with this password (None: none) and query, as text with its secrets."""
    return URL.create(parsed.drivername, username=parsed.username, password=password,
                      host=parsed.host, port=parsed.port, database=parsed.database,
                      query=query).render_as_string(hide_password=False)


def secure_url(url: str) -> str:
    """``url`` without its password and password file, for the drivers built on libpq (which
    read ``$PGPASSWORD`` and ``$PGPASSFILE`` themselves): the password (the query's, which the
    driver would use, else the user's) moves to ``$PGPASSWORD``, the file to ``$PGPASSFILE``.
    Other drivers (pg8000, MySQL) keep them in the URL, which is only ever printed redacted."""
    parsed = _parse_quietly(url)
    if parsed is None or parsed.drivername not in LIBPQ_DRIVERS:
        return url
    moved = {"password": _last(parsed.query.get("password")) or parsed.password or None,
             "passfile": _last(parsed.query.get("passfile"))}
    if not any(moved.values()):
        return url
    for key, value in moved.items():
        if value:
            os.environ[_ENV_OF[key]] = str(value)
    query = {k: v for k, v in parsed.query.items() if k not in _ENV_OF}
    secured = _rebuilt(parsed, None, query)
    _MOVED[secured] = _Moved(redact(url), tuple(_secrets(parsed)))
    return secured


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error) with every secret of ``url`` replaced by ``***``, as written
    and as quoted in a URL; for a URL ``secure_url`` returned, the secrets it moved."""
    parsed = _parse_quietly(url)
    secrets = _secrets(parsed) if parsed is not None else []
    if url in _MOVED:
        secrets = sorted({*secrets, *_MOVED[url].secrets}, key=len, reverse=True)
    for secret in secrets:
        for form in (secret, quote(secret, safe=""), quote_plus(secret)):
            text = text.replace(form, MASK)
    return text


def _password_file() -> Path:
    """The file libpq reads passwords from: ``$PGPASSFILE``, else ``~/.pgpass``."""
    return Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")


def unmask(url: str) -> str:
    """``url`` as ``redact`` printed it, made usable again: a ``***`` password (the user's or
    the query's) stands for one that was not shown, and becomes ``$PGPASSWORD`` when set, else
    goes, for libpq to read the password file (``$PGPASSFILE`` or ``~/.pgpass``); a ``***``
    password file or SSL key password goes (libpq's defaults apply). A URL without a ``***``
    is returned as given (so a real password that is literally ``***`` cannot be used).

    Raises:
        StorageError: a ``***`` password with neither ``$PGPASSWORD`` nor a password file.
    """
    parsed = _parse_quietly(url)
    holes = _placeholders(parsed) if parsed is not None else []
    if parsed is None or not holes:
        return url
    password = os.environ.get("PGPASSWORD") or None
    user_password = parsed.password
    if {"user", "password"} & set(holes):
        if password is None and not _password_file().is_file():
            raise StorageError(f"storage {redact(url)}: its password *** was hidden when "
                               "printed; set $PGPASSWORD or use ~/.pgpass")
        user_password = password
    query = {k: v for k, v in parsed.query.items() if k not in holes}
    return _rebuilt(parsed, user_password, query)


def _placeholders(parsed: URL) -> list[str]:
    """Where ``parsed`` holds a ``***`` placeholder: "user" (its user's password) or the
    names of the query's secret parameters."""
    found = ["user"] if parsed.password == MASK else []
    return found + [k for k in SECRET_KEYS if MASK in _values(parsed.query.get(k))]
