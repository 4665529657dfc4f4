"""Keeping secrets out of what we print: one place that redacts URLs, text and options.

A checkpoint location may carry credentials inline (``ftp://user:secret@host/state``) and
``storage_options`` usually do (keys, tokens, passwords). Every repr, log line, error
message and metric that shows a location goes through :func:`redact_url` or
:func:`redact_text`; storage options are never printed, only :func:`redact_options`'
summary of their keys.

    >>> redact_url("s3://AKIA:s3cr3t@bucket/state")
    's3://AKIA:***@bucket/state'
    >>> redact_text("cannot read ftp://u:pw@host/x (timeout)")
    'cannot read ftp://u:***@host/x (timeout)'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["MASK", "redact_nested", "redact_options", "redact_text", "redact_url",
           "url_password"]

MASK = "***"

# scheme://user:password@ ; the password runs to the last '@' before the path
_INLINE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/:@]*):"
                     r"(?P<password>[^\s/]*)@")


# user:password@host without a scheme, as a filesystem's root keeps it after stripping
# ``memory://`` (``/user:password@host/x``): after a separator, followed by a host
_BARE = re.compile(r"(?P<scheme>(?:^|(?<=[\s/'\"(=])))(?P<user>[^\s/:@'\"()]+):"
                   r"(?P<password>[^\s/'\"]+)@(?=[^\s/@'\"]+|/)")  # a host, or none (file://)


def _mask(m: re.Match[str]) -> str:
    return f"{m.group('scheme')}{m.group('user')}:{MASK}@"


def url_password(url: str) -> str | None:
    """The inline password of ``url`` (``scheme://user:password@host/...``), if any."""
    m = _INLINE.search(url) if isinstance(url, str) else None
    if m is None or not m.group("password"):
        return None
    return m.group("password")


def redact_url(url: object) -> str:
    """``url`` with an inline password replaced by ``***``; other URLs unchanged."""
    return _INLINE.sub(_mask, str(url))


def redact_text(text: object, *urls: str) -> str:
    """``text`` with every inline URL password replaced by ``***``, also where the scheme
    was stripped (``/user:password@host/...``).

    Parameters
    ----------
    text : object
        Any message (converted with ``str``).
    *urls : str
        Locations the text may mention in a rewritten form (a filesystem strips the
        scheme, so ``memory://u:pw@h/x`` becomes the root ``/u:pw@h/x``): their
        ``:password@`` is masked wherever it appears.
    """
    out = _BARE.sub(_mask, _INLINE.sub(_mask, str(text)))
    for url in urls:
        secret = url_password(url)
        if secret:
            out = out.replace(f":{secret}@", f":{MASK}@")
    return out


def redact_options(options: Mapping[str, object] | None) -> str:
    """What may be shown of storage options: their keys, never their values."""
    if not options:
        return "{}"
    if not isinstance(options, Mapping):
        return f"<{type(options).__name__}>"
    return "{" + ", ".join(f"{k!r}: {MASK}" for k in sorted(map(str, options))) + "}"



def redact_nested(value: object) -> object:
    """A copy of ``value`` (nested dicts, lists, tuples, strings) fit to print: every
    ``storage_options`` entry summarised by :func:`redact_options`, every string through
    :func:`redact_text`."""
    if isinstance(value, Mapping):
        return {k: (redact_options(v) if k == "storage_options" and isinstance(v, Mapping)
                    else redact_nested(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_nested(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value
