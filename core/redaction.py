"""Redaction: keep secrets out of logs, alerts and run records.

Observers write tool arguments, evidence and model text to places that many people read.
:class:`Redactor` masks, at any depth of dicts and lists:

* the value of every key named in a redaction list (case-insensitive, ``-`` read as ``_``),
  and of every key that *ends* in ``_<name>`` (``github_token``, ``X-Api-Key``) -- so
  ``api_key`` and ``Authorization`` are masked, while ``tokens`` or ``max_tokens`` are not;
* ``key=value`` / ``"key": "value"`` pairs of those keys inside free text (e.g. the raw JSON
  arguments the model sent, which may not even parse);
* text matching the secret patterns (``sk-...`` API keys, ``Bearer ...`` credentials);
* literal secrets it was given (e.g. the value of the model's API-key environment variable).

:func:`redact_url` does it for a URL (a store's, an alert sink's): the password of
``user:password@host`` and every query parameter named like a secret (``?password=``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote_plus, urlsplit

__all__ = [
    "DEFAULT_REDACT_KEYS",
    "DEFAULT_SECRET_PATTERNS",
    "MASK",
    "Redactor",
    "model_api_key",
    "redact_url",
]

MASK = "[REDACTED]"

DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "api_key",
    "apikey",
    "authorization",
    "proxy_authorization",
    "password",
    "passwd",
    "passphrase",
    "token",
    "secret",
    "private_key",
    "credential",
    "credentials",
    "cookie",
    "set_cookie",
    "session_id",
)

DEFAULT_SECRET_PATTERNS: tuple[str, ...] = (
    r"\bsk-[A-Za-z0-9_\-]{12,}",  # OpenAI-style API keys (also DashScope, DeepSeek)
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{8,}",  # HTTP bearer credentials
)

_MIN_LITERAL = 6  # literal secrets shorter than this are not masked in free text
_KEY_CACHE_SIZE = 4096  # field names remembered per Redactor (is_secret_key)


def _norm(key: str) -> str:
    return key.strip().lower().replace("-", "_")


class Redactor:
    """Masks secrets in nested data and free text (see the module docstring).

    :param keys: field names whose values are secret.
    :param patterns: regular expressions for secrets inside any text.
    :param literals: exact secret strings to mask wherever they appear.
    :param mask: the replacement text.
    """

    def __init__(
        self,
        keys: Iterable[str] = DEFAULT_REDACT_KEYS,
        patterns: Iterable[str] = DEFAULT_SECRET_PATTERNS,
        literals: Iterable[str] = (),
        mask: str = MASK,
    ) -> None:
        self.keys = frozenset(_norm(k) for k in keys if k.strip())
        self._key_cache: dict[str, bool] = {}
        self.mask = mask
        self._patterns = [re.compile(p) for p in patterns]
        self._literals = sorted(
            {s for s in literals if len(s) >= _MIN_LITERAL}, key=len, reverse=True
        )
        if self.keys:
            names = "|".join(
                sorted(
                    (re.escape(k).replace("_", "[_-]") for k in self.keys), key=len, reverse=True
                )
            )
            # "key": "value"  /  key=value  /  key: value  (key may carry a prefix: x_api_key).
            # Linear time: a match may only start where a word starts (the lookbehind), and
            # the word is taken whole, then given back until a key name ends it -- not a lazy
            # prefix retried from every position, which was quadratic in a long word.
            self._pairs: re.Pattern[str] | None = re.compile(
                r"""(?i)(["']?(?<![\w-])(?:[\w-]*(?<![a-z0-9]))?(?:"""
                + names
                + r""")["']?\s*[:=]\s*)"""
                r"""(?!""" + re.escape(mask) + r""")"""  # already masked (by a pattern)
                r"""("(?:[^"\\]|\\.)*"|'[^']*'"""  # a quoted value, or a bare one with
                r"""|(?:(?:bearer|basic|digest|token|apikey)[ \t]+)?[^\s,;&}\]]+)"""  # scheme
            )
            # The same pairs one JSON level down: inside JSON-quoted text -- a note's quoted
            # data (loopwarden.notes.quote_data), a JSON document held in a JSON string -- a
            # call's arguments read \"api_key\": \"value\".  Starts only at \" (linear).
            # The quoted value: plain characters, an escape of the outer level (\n), or an
            # escape of the inner one (\\\" an escaped quote, \\\\ a backslash).
            self._escaped: re.Pattern[str] | None = re.compile(
                r"""(?i)(\\"(?:[\w-]*(?<![a-z0-9]))?(?:""" + names + r""")\\"\s*[:=]\s*)"""
                r"""(?!\\?""" + re.escape(mask) + r""")"""
                r"""(\\"(?:[^"\\]|\\[^"\\]|\\\\(?:\\["\\]|[^\\]))*\\"|[^\s,;&}\]\\]+)"""
            )
        else:
            self._pairs = None
            self._escaped = None

    def add_literal(self, secret: str | None) -> None:
        """Also mask this exact string (ignored when empty or very short)."""
        if secret and len(secret) >= _MIN_LITERAL and secret not in self._literals:
            self._literals.append(secret)
            self._literals.sort(key=len, reverse=True)

    def is_secret_key(self, key: object) -> bool:
        """Whether values under ``key`` are masked (remembered per key: records and requests
        repeat the same few field names, and the suffix test scans every secret name)."""
        cache = self._key_cache
        found = cache.get(key) if isinstance(key, str) else None
        if found is not None:
            return found
        k = _norm(str(key))
        secret = k in self.keys or any(k.endswith("_" + name) for name in self.keys)
        if isinstance(key, str):
            if len(cache) >= _KEY_CACHE_SIZE:
                cache.clear()  # bounded: a stream of ever-new keys cannot grow it
            cache[key] = secret
        return secret

    def text(self, value: str) -> str:
        """Mask secret literals, patterns and ``key=value`` pairs inside free text."""
        out = value
        for lit in self._literals:
            if lit in out:
                out = out.replace(lit, self.mask)
        for pat in self._patterns:
            out = pat.sub(self.mask, out)
        if self._pairs is not None:
            out = self._pairs.sub(self._mask_pair, out)
            if self._escaped is not None and '\\"' in out:
                out = self._escaped.sub(self._mask_escaped_pair, out)
        return out

    def _mask_pair(self, m: re.Match[str]) -> str:
        value = m.group(2)
        if value.startswith(('"', "'")):
            return f"{m.group(1)}{value[0]}{self.mask}{value[0]}"
        return m.group(1) + self.mask

    def _mask_escaped_pair(self, m: re.Match[str]) -> str:
        if m.group(2).startswith('\\"'):
            return f'{m.group(1)}\\"{self.mask}\\"'
        return m.group(1) + self.mask

    def __call__(self, value: Any) -> Any:
        """A copy of ``value`` with secrets masked at any depth (the input is not changed)."""
        if isinstance(value, Mapping):
            return {
                k: (self.mask if self.is_secret_key(k) and v is not None else self(v))
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def scrub(self, value: Any) -> Any:
        """``value`` with secrets masked as :meth:`__call__` masks them -- but ``value`` itself
        when it holds none, and a copy that keeps its shape otherwise (a tuple stays a tuple;
        what needed no masking is shared).  For values kept in process as well as written
        out (a verdict's evidence): unchanged data stays the very same object."""
        if isinstance(value, str):
            out = self.text(value)
            return value if out == value else out
        if isinstance(value, Mapping):
            items: dict[Any, Any] = {}
            changed = False
            for k, v in value.items():
                clean = self.mask if self.is_secret_key(k) and v is not None else self.scrub(v)
                changed = changed or clean is not v
                items[k] = clean
            return items if changed else value
        if isinstance(value, (list, tuple)):
            cleaned = [self.scrub(v) for v in value]
            if all(c is v for c, v in zip(cleaned, value, strict=True)):
                return value
            return cleaned if isinstance(value, list) else tuple(cleaned)
        return value

    def json_text(self, raw: str) -> str:
        """Redact a JSON document given as text (e.g. raw tool arguments).

        Parsed and re-encoded when it is valid JSON, so nested keys are found; otherwise
        masked as free text.
        """
        try:
            return json.dumps(self(json.loads(raw)), ensure_ascii=False)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to walk
            return self.text(raw)


def model_api_key(deployment: Any) -> str | None:
    """The value of the deployment's model API-key variable (``[model] api_key_env``), if set.

    Observers add it to their redactor as a literal, so the key never reaches a log line even
    when a tool or the model echoes it.
    """
    config = getattr(deployment, "config", None)
    env = getattr(getattr(config, "model", None), "api_key_env", None)
    return os.environ.get(env) if isinstance(env, str) and env else None


#: the mask :func:`redact_url` writes (short: a URL stays readable)
URL_MASK = "***"


def redact_url(url: str) -> str:
    """``url`` without its secrets, for logs, run records and the command line.

    The password of ``scheme://user:password@host`` and the value of every query parameter
    whose name is a secret key of :data:`DEFAULT_REDACT_KEYS` (``?password=``, ``&token=``,
    ``?api_key=``) become ``***``; the rest -- scheme, user, host, port, path -- stays.
    A URL that does not even parse is masked from ``//`` to the last ``@``, and in every
    secret-looking query value.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket: mask what may be a password
        head, sep, tail = url.rpartition("@")
        if sep and "//" in head:
            url = head.split("//", 1)[0] + "//" + URL_MASK + "@" + tail
        return _URL_SECRET_PARAM.sub(lambda m: m.group(1) + URL_MASK, url)
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = userinfo.split(":", 1)[0] + ":" + URL_MASK + "@" + host
    query = parts.query
    if query:
        query = "&".join(_redact_param(p) for p in query.split("&"))
    out = url  # edited in place: urlunsplit would turn unix:///path into unix:/path
    if query != parts.query:
        i = out.index("?") + 1
        out = out[:i] + query + out[i + len(parts.query) :]
    if netloc != parts.netloc:
        out = out.replace(parts.netloc, netloc, 1)  # the first thing after "scheme://"
    return out


_SECRET_KEYS = Redactor()


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    if eq and _SECRET_KEYS.is_secret_key(unquote_plus(name)):
        return name + "=" + URL_MASK
    return param


_URL_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:[\w.-]*[_-])?(?:"
    + "|".join(re.escape(k) for k in DEFAULT_REDACT_KEYS)
    + r")=)[^&#]*"
)
