"""Redaction of secrets: the one place that decides what is hidden from records, reports, logs, traces and
error messages.

What :func:`redact` replaces with ``***``:

* the values of environment variables named like secrets (``*_API_KEY``, ``*TOKEN*``, ``*SECRET*``,
  ``*PASSWORD*``), and every value registered with :func:`register_secret` (a key read from a variable of
  any name, such as ``--api-key-env MY_VAR``);
* the ``user:password@`` of a URL (the password may itself hold ``@``), and, for every configured URL with
  credentials (:func:`register_url_credentials`, and URLs found in environment variables), its password,
  ``user:password`` and the ``base64(user:password)`` token of its basic auth, wherever they appear;
* ``Authorization: SCHEME TOKEN`` header values, ``Bearer TOKEN``, ``Basic TOKEN`` (a base64
  ``user:password``), ``api_key=...`` and key-shaped strings (``sk-...``), even when they were never
  configured here, as when a server echoes a header back in an error.

:func:`install_log_redaction` applies the same to every log record of the process; the MLflow integration
applies it to every trace span (:mod:`ragsuite.cli.mlflow_tracking`).

:func:`split_url` takes a URL's credentials out of its address, once, without registering anything (a server
behind HTTP basic auth gets them as a header): the LM spec parser (:mod:`ragsuite.lm`) and the replicas
(:mod:`ragsuite.lm_replicas`) share the :class:`SplitURL` it returns, whose ``register`` hides them when the
endpoint is used. :func:`strip_credentials` gives the address as recorded.

Example:
    >>> register_url_credentials("http://alice:p@ss-w0rd@gpu:8000/v1")
    >>> redact("GET http://alice:p@ss-w0rd@gpu:8000/v1 failed; Authorization: Basic YWxpY2U6cEBzcy13MHJk")
    'GET http://***@gpu:8000/v1 failed; Authorization: Basic ***'
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

REDACTED = "***"

# Environment variables whose values are secrets (redacted wherever they appear).
_SECRET_NAME = re.compile(r"(API_KEY|APIKEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)
# Shorter values are too likely to occur in ordinary text to be replaced everywhere.
_MIN_SECRET_CHARS = 6
#: Sent to keyless local servers as the key: the OpenAI client insists on some key.
PLACEHOLDER_KEY = "EMPTY"
# Placeholders sent to keyless servers: not secrets, and too common to replace.
_NOT_SECRETS = frozenset({PLACEHOLDER_KEY, "unused", "placeholder"})
# user:password@ in a URL; greedy up to the authority's last "@", since a password may contain "@".
# A scheme starts where no scheme character precedes: else a long word is rescanned from every letter.
_URL_CREDENTIALS = re.compile(r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)([^\s/?#\"<>]*)@", re.IGNORECASE)
_URL_PASSWORD = re.compile(
    r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://[^\s:/?#\"<>@]*):[^\s/?#\"<>]*@", re.IGNORECASE
)
_AUTHORIZATION = re.compile(
    r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)((?:[A-Za-z][\w-]*\s+)?)([^\s\"',;}]+)"
)
_BASIC = re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")
_SECRET_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-~+/]{8,}=*"),
    re.compile(r"(?i)(api[_-]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]{6,}"),
)

_REGISTERED: set[str] = set()
_REGISTERED_LOCK = threading.Lock()


def register_secret(value: str | None) -> None:
    """Redact ``value`` from now on, wherever it appears (values under 6 characters are not registered:
    replacing them everywhere would garble ordinary text)."""
    if value and len(value) >= _MIN_SECRET_CHARS and value not in _NOT_SECRETS:
        with _REGISTERED_LOCK:
            _REGISTERED.add(value)


def credential_forms(url: str) -> list[str]:
    """The secret strings a URL's ``user:password@`` puts on the wire: the password (raw and as written),
    ``user:password`` and its basic-auth token ``base64(user:password)``; empty without a password."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        username, password = parts.username, parts.password
    except ValueError:
        return []
    if not password:
        return []
    user, secret = urllib.parse.unquote(username or ""), urllib.parse.unquote(password)
    pair = f"{user}:{secret}"
    token = base64.b64encode(pair.encode()).decode()
    return [form for form in {secret, password, pair, f"{username}:{password}", token} if form]


def register_url_credentials(url: str | None) -> None:
    """Redact the password, ``user:password`` and basic-auth token of ``url`` wherever they appear."""
    for form in credential_forms(url or ""):
        register_secret(form)


def strip_credentials(url: str | None) -> str | None:
    """``url`` without ``user:password@`` and query string (which may carry tokens)."""
    if not url:
        return url
    parsed = urllib.parse.urlparse(url)
    netloc = parsed.hostname or ""
    if parsed.port:
        netloc += f":{parsed.port}"
    return urllib.parse.urlunparse(parsed._replace(netloc=netloc, query="", fragment=""))


@dataclass(frozen=True)
class SplitURL:
    """A server URL with its ``user:password@`` taken out: where requests go, and the credentials it carried.

    Attributes:
        address: The URL without ``user:password@`` (its path and query kept: they are sent).
        authorization: ``Basic base64(user:password)`` for a server behind HTTP basic auth, else None.
        secrets: The strings to redact once the URL is used (see :func:`credential_forms`).
    """

    address: str
    authorization: str | None = field(default=None, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def public(self) -> str:
        """The address as recorded and shown: no credentials, no query string."""
        return strip_credentials(self.address) or self.address

    def register(self) -> SplitURL:
        """Redact this URL's credentials from now on, wherever they appear; returns ``self``."""
        for secret in self.secrets:
            register_secret(secret)
        return self


def split_url(url: str) -> SplitURL:
    """``http://user:pass@host/v1`` -> ``SplitURL("http://host/v1", "Basic ...")``, registering nothing: the
    one place a URL's credentials are taken apart. A URL without credentials keeps its address as given."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return SplitURL(url)
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    address = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return SplitURL(address, f"Basic {token}", tuple(sorted(credential_forms(url))))


def split_url_credentials(url: str) -> tuple[str, str | None]:
    """``http://user:pass@host/v1`` -> (``http://host/v1``, ``"Basic ..."``), the credentials registered for
    redaction from now on. A URL without credentials comes back unchanged with ``None``."""
    split = split_url(url).register()
    return split.address, split.authorization


def _environment_secrets() -> set[str]:
    values = set()
    for name, value in os.environ.items():
        if not value:
            continue
        if _SECRET_NAME.search(name):
            values.add(value)
        if "://" in value and "@" in value:  # HF_ENDPOINT, RAGSUITE_MIRROR, ... with credentials
            values.update(credential_forms(value))
    return {v for v in values if len(v) >= _MIN_SECRET_CHARS and v not in _NOT_SECRETS}


def secret_values() -> list[str]:
    """Every known secret value: the environment's and the registered ones, longest first (so that a
    secret containing another is replaced whole)."""
    with _REGISTERED_LOCK:
        values = _environment_secrets() | _REGISTERED
    return sorted(values, key=len, reverse=True)


def _basic_token(match: re.Match[str]) -> str:
    # "Basic" is an ordinary word too ("basic retrieval"): only a base64 "user:password" is a token.
    token = match.group(2)
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    return match.group(1) + REDACTED if b":" in decoded else match.group(0)


def _url_credentials(match: re.Match[str]) -> str:
    if match.group(2).endswith(f":{REDACTED}"):  # already hidden, the user name kept (hide_url_passwords)
        return match.group(0)
    return f"{match.group(1)}{REDACTED}@"


def _authorization(match: re.Match[str]) -> str:
    # The scheme (Basic, Bearer, ...) stays: it says what was hidden.
    if match.group(3) == REDACTED:
        return match.group(0)
    return match.group(1) + match.group(2) + REDACTED


def redact(text: str) -> str:
    """``text`` with secrets replaced by ``***`` (see the module docstring for what counts as one).

    Example:
        >>> os.environ["OPENAI_API_KEY"] = "sk-test-123456789012345"
        >>> redact("401: key sk-test-123456789012345 rejected")
        '401: key *** rejected'
    """
    if not text:
        return text
    # Shapes first: a registered secret that is part of a longer token (a user:password's base64 without its
    # padding) would otherwise cut the token and leave its tail in sight.
    text = _URL_CREDENTIALS.sub(_url_credentials, text)
    text = _AUTHORIZATION.sub(_authorization, text)
    text = _BASIC.sub(_basic_token, text)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    for value in secret_values():
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def hide_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it hidden and the user name kept
    (``postgresql://user:secret@host`` -> ``postgresql://user:***@host``); nothing else is changed."""
    return _URL_PASSWORD.sub(rf"\1:{REDACTED}@", text)


def redact_value(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string inside it (dicts, lists and tuples walked)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_value(k): redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


class _RedactedRecord(logging.LogRecord):
    """A log record whose message and traceback are redacted when a handler formats them."""

    _redacted_exc_text: str | None = None

    def getMessage(self) -> str:
        return redact(super().getMessage())

    @property  # type: ignore[override]
    def exc_text(self) -> str | None:
        # Formatters cache the formatted traceback here when it is None; hand them a redacted one.
        if self._redacted_exc_text is None and getattr(self, "exc_info", None):
            self._redacted_exc_text = redact(logging.Formatter().formatException(self.exc_info))
        return self._redacted_exc_text

    @exc_text.setter
    def exc_text(self, value: str | None) -> None:
        self._redacted_exc_text = redact(value) if value else value


def _print_redacted_traceback(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    import sys
    import traceback

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


def install_log_redaction() -> None:
    """Make every log record of this process, from every library's logger and to every handler, come out
    redacted (its message, arguments and traceback), and so the traceback of an exception nothing caught.
    Idempotent."""
    import sys

    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _print_redacted_traceback
    factory = logging.getLogRecordFactory()
    if getattr(factory, "_ragsuite_redacting", False):
        return

    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if type(record) is logging.LogRecord:
            record.__class__ = _RedactedRecord
        return record

    make_record._ragsuite_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make_record)


__all__ = [
    "PLACEHOLDER_KEY",
    "REDACTED",
    "SplitURL",
    "credential_forms",
    "hide_url_passwords",
    "install_log_redaction",
    "redact",
    "redact_value",
    "register_secret",
    "register_url_credentials",
    "secret_values",
    "split_url",
    "split_url_credentials",
    "strip_credentials",
]
