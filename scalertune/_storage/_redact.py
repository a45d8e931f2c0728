"""Hiding storage passwords: a URL or a message is safe to print and store once redacted.

A storage URL is parsed with SQLAlchemy's own parser and rendered with its password and every
secret query value hidden (``user:PW@``, ``:PW@`` and ``?password=PW`` alike). A message that
may quote a URL's secrets (a database driver's error) is redacted against that URL: each of
its secrets, in every spelling a message may use, becomes ``***``. Nothing is remembered
between calls.
"""

from __future__ import annotations

import re
import urllib.parse

HIDDEN = "***"
#: Query-string keys whose value is a secret (``?password=``, ``sslpassword``, a whole DSN).
_SECRET_KEYS = ("pass", "pwd", "secret", "token", "key", "dsn", "credential")
#: Stands for a hidden query value while SQLAlchemy renders the URL (it would escape "***").
_PLACEHOLDER = "scalertunehiddenvalue"
#: Secrets this long are hidden wherever they appear in a message; shorter ones only where
#: they stand alone (not inside a word): "e" or "pw" inside words would garble the message
#: and spell the secret out.
_SECRET_ANYWHERE = 8


def redact(text: str, url: str | None = None) -> str:
    """``text`` with the secrets of the storage ``url`` (or of ``text`` itself, when it is a
    URL) replaced by ``***``. An unparsable URL keeps only its scheme.

    >>> redact("postgresql://me:hunter22@db/optuna")
    'postgresql://me:***@db/optuna'
    >>> redact("FATAL: password hunter22 rejected", "postgresql://me:hunter22@db/optuna")
    'FATAL: password *** rejected'
    """
    if _is_url(text):
        text, secrets = _render_hidden(text)
    else:
        secrets = []
    if url is not None and _is_url(url):
        secrets += _render_hidden(url)[1]
    for secret in sorted(_spellings(secrets), key=len, reverse=True):
        if len(secret) >= _SECRET_ANYWHERE:
            text = text.replace(secret, HIDDEN)
        else:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", HIDDEN, text)
    return text


def _is_url(text: str) -> bool:
    return "://" in text and not any(c.isspace() for c in text)


def _render_hidden(url: str) -> tuple[str, list[str]]:
    """The URL rendered with its secrets hidden, and those secrets."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # SQLAlchemy raises several kinds for a malformed URL
        return url.split("://", 1)[0] + "://" + HIDDEN, []
    secrets = [parsed.password] if parsed.password else []
    query = dict(parsed.query)
    for key, value in parsed.query.items():
        if any(word in key.lower() for word in _SECRET_KEYS):
            secrets += [value] if isinstance(value, str) else list(value)
            query[key] = _PLACEHOLDER
    if not secrets:
        return url, []
    rendered = parsed.set(query=query).render_as_string(hide_password=True)
    return rendered.replace(_PLACEHOLDER, HIDDEN), secrets


def _spellings(secrets: list[str]) -> set[str]:
    """Each secret as written, and as a URL escapes it."""
    return {form for s in secrets if s
            for form in (s, urllib.parse.quote(s, safe=""), urllib.parse.quote_plus(s),
                         urllib.parse.quote(s))}
