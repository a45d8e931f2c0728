"""Hiding storage passwords: a URL or a message is safe to print and store once redacted.

A storage URL is parsed with SQLAlchemy's own parser and rendered with its password and every
secret query value hidden (``user:PW@``, ``:PW@`` and ``?password=PW`` alike), whatever the
password holds (spaces, ``:``, escapes). A message that may quote a URL's secrets (a database
driver's error) is redacted against that URL:

- the URL itself, in any spelling SQLAlchemy or a user writes it, becomes the redacted URL;
- a secret where the message gives it as one (``:PW@``, ``password=PW``) becomes ``***``;
- elsewhere a secret is hidden only when it cannot be ordinary text: at least
  ``_DISTINCTIVE_CHARS`` characters of at least two kinds (letters, digits, anything else).
  A password ``127`` must leave ``127.0.0.1`` alone, and a password that is a word must not
  mask that word in ``password authentication failed``: the message says the password
  nowhere else.

Nothing is remembered between calls.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse

HIDDEN = "***"
#: Query-string keys whose value is a secret (``?password=``, ``sslpassword``, a whole DSN).
_SECRET_KEYS = ("pass", "pwd", "secret", "token", "key", "dsn", "credential")
#: Stands for a hidden query value while SQLAlchemy renders the URL (it would escape "***").
_PLACEHOLDER = "scalertunehiddenvalue"
#: A secret this long, of two kinds of characters or more, is hidden wherever it appears in a
#: message: no word, number or host name of a driver's message looks like it.
_DISTINCTIVE_CHARS = 8
#: A URL: a scheme, then ``://``.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def redact(text: str, url: str | None = None) -> str:
    """``text`` with the secrets of the storage ``url`` (or of ``text`` itself, when it is a
    URL) hidden. An unparsable URL keeps only its scheme.

    >>> redact("postgresql://me:my secret@db/optuna")
    'postgresql://me:***@db/optuna'
    >>> redact("FATAL: password hunter22 rejected", "postgresql://me:hunter22@db/optuna")
    'FATAL: password *** rejected'
    >>> redact("no server at 127.0.0.1", "postgresql://me:127@127.0.0.1/optuna")
    'no server at 127.0.0.1'
    """
    secrets: list[str] = []
    if _is_url(text):
        text, secrets = _render_hidden(text)
    if url is not None and _is_url(url):
        hidden, own = _render_hidden(url)
        secrets += own
        for spelled in sorted(_url_spellings(url), key=len, reverse=True):
            if own and spelled != hidden:
                text = text.replace(spelled, hidden)
    for secret in sorted(_spellings(secrets), key=len, reverse=True):
        text = _hide_fields(text, secret)
        if _distinctive(secret):
            text = text.replace(secret, HIDDEN)
    return text


def _is_url(text: str) -> bool:
    return bool(_URL.match(text))


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


def _url_spellings(url: str) -> set[str]:
    """The URL as given, and as SQLAlchemy renders it with its password shown."""
    from sqlalchemy.engine import make_url

    forms = {url}
    with contextlib.suppress(Exception):  # malformed: only the given spelling can appear
        forms.add(make_url(url).render_as_string(hide_password=False))
    return forms


def _spellings(secrets: list[str]) -> set[str]:
    """Each secret as written, and as a URL escapes it."""
    return {
        form
        for s in secrets
        if s
        for form in (
            s,
            urllib.parse.quote(s, safe=""),
            urllib.parse.quote_plus(s),
            urllib.parse.quote(s),
        )
    }


def _hide_fields(text: str, secret: str) -> str:
    """``secret`` hidden where the text gives it as a password: in a URL's ``:PW@``, or as the
    value of a ``password=`` (``pwd=``, ``passwd:``) field, quoted or not."""
    s = re.escape(secret)
    text = re.sub(rf"(?<=:){s}(?=@)", HIDDEN, text)
    return re.sub(
        rf"(?i)((?:pass(?:word|wd)?|pwd)\s*[=:]\s*['\"]?){s}(?=['\"]?(?:\s|&|;|,|$))",
        lambda m: m.group(1) + HIDDEN,
        text,
    )


def _distinctive(secret: str) -> bool:
    """Whether ``secret`` cannot be ordinary text: long enough, and of two kinds or more of
    characters (letters, digits, anything else)."""
    kinds = {"letter" if c.isalpha() else "digit" if c.isdigit() else "other" for c in secret}
    return len(secret) >= _DISTINCTIVE_CHARS and len(kinds) >= 2
