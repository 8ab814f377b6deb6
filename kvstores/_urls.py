"""Store URLs: options in query strings (taken out for the store, the rest left for the driver),
and the ONE redaction of credentials for every message that names a store.

:func:`redact` is what kvstores prints, logs or raises in place of a URL; :func:`redact_text`
scrubs a URL's secrets out of any other text (a driver's message, a line of output). What
counts as a secret:

- the password of the user info (``redis://user:***@host``, ``redis://:***@host``); a user
  info without a password is masked whole (``redis://***@host``), since ``redis://PASSWORD@host``
  is a common slip;
- the value of every query option whose name holds ``pass``, ``pwd``, ``secret``, ``token``,
  ``key``, ``credential`` or ``authmechanismproperties`` (``?password=***``,
  ``?tlsCertificateKeyFilePassword=***``, ``?ssl_keyfile=***``: a key file's path is masked
  too, a small price for one simple rule).

Text that does not parse as a URL is masked conservatively rather than passed through: the user
info runs to the last ``@`` (so a password with an unescaped ``/``, ``?``, ``#`` or ``@`` stays
masked, and an ``@`` in the query masks the host too), except in a URL without a host
(``sqlite:///a@b.db``); a string without ``://`` but with an ``@`` is masked up to it. Neither
function ever raises.
A user name alone is not hunted in free text: to every driver kvstores uses it is a user name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qsl, unquote, unquote_plus, urlencode, urlsplit

__all__ = ["MASK", "check_user_info", "flag", "redact", "redact_text", "split_url_options"]

MASK = "***"
"""What a secret is replaced with."""

_SECRET_OPTION = re.compile(r"pass|pwd|secret|token|key|credential|authmechanismproperties", re.IGNORECASE)
_OPTION = re.compile(r"(?P<lead>[?&])(?P<name>[^=&#]*)=(?P<value>[^&]*)")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def flag(text: str) -> bool:
    """A boolean URL query option: true/false, 1/0, yes/no, on/off."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def split_url_options(url: str, converters: Mapping[str, Callable[[str], Any]]) -> tuple[str, dict[str, Any]]:
    """Take the store's own options (named in ``converters``) out of ``url``'s query.

    Returns the URL with the rest of its query untouched (for the driver) and the options,
    each converted. ``batching`` (a :func:`flag`) is every store's own option.
    """
    converters = {"batching": flag, **converters}
    parts = urlsplit(url)
    rest: list[tuple[str, str]] = []
    options: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in converters:
            options[name] = converters[name](value)
        else:
            rest.append((name, value))
    if options:  # rebuilt by hand: urlunsplit would turn sqlite:////abs.db into sqlite://abs.db
        url = url.partition("?")[0] + (f"?{urlencode(rest)}" if rest else "")
        url += f"#{parts.fragment}" if parts.fragment else ""
    return url, options


def _user_info(url: str) -> tuple[str, str, str]:
    """``url`` as (what comes before the user info, the user info, the rest from its ``@``)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url  # not a URL: whatever precedes an "@" may be a password all the same
    elif rest.startswith("/"):
        return url, "", ""  # no authority (sqlite:///path, unix:///socket): an "@" further on is a path's
    end = rest.rfind("@")  # the last: a password may hold an unescaped "@", "/", "?" or "#"
    if end < 0:
        return url, "", ""
    return scheme + separator, rest[:end], rest[end:]


def check_user_info(url: str) -> None:
    """Refuse ``url`` when its password holds an unescaped ``/``, ``?`` or ``#``.

    A URL parser (every driver's) ends the host part at the first of them, reads the start of
    the password as a host and a port, and its errors then carry that part of the password
    ("Port could not be cast to integer value as 'Mm4q'"). The ``ValueError`` raised here names
    the URL redacted, and nothing of the password. A user info whose text before the delimiter
    reads as ``host:port`` (digits) is taken as a host, so that ``redis://host:6379/0?name=a@b``
    stays valid.
    """
    _, user_info, _ = _user_info(url)
    cut = min((i for i in map(user_info.find, "/?#") if i >= 0), default=-1)
    if cut < 0:
        return
    _, colon, port = user_info[:cut].rpartition(":")
    if colon and not port.isdigit():
        raise ValueError(
            f"{redact(url)!r}: the password holds an unescaped '/', '?' or '#'; "
            "percent-encode it (urllib.parse.quote(password, safe=''))"
        )


def _masked_options(text: str) -> str:
    def mask(match: re.Match[str]) -> str:
        if not _SECRET_OPTION.search(unquote(match["name"])):
            return match.group()
        return f"{match['lead']}{match['name']}={MASK}"

    return _OPTION.sub(mask, text)


def redact(url: str) -> str:
    """``url`` fit to print: the password (or a lone user info) and secret query options masked.

    ``redis://app:pw@host:6379/0?password=x`` becomes ``redis://app:***@host:6379/0?password=***``.
    """
    before, user_info, rest = _user_info(url)
    if not user_info:
        return _masked_options(url)
    name, has_password, _ = user_info.partition(":")
    return before + (f"{name}:{MASK}" if has_password else MASK) + _masked_options(rest)


def _secrets(url: str) -> set[str]:
    """The secrets ``url`` holds, as written and decoded."""
    _, user_info, _ = _user_info(url)
    _, has_password, password = user_info.partition(":")
    found = [password] if has_password else []
    with suppress(ValueError):  # as a driver parses it too: an "@" in the query makes the one above longer
        found.append(urlsplit(url).password or "")
    for match in _OPTION.finditer(url):
        if _SECRET_OPTION.search(unquote(match["name"])):
            found.append(match["value"])
    return {form for secret in found for form in (secret, unquote(secret), unquote_plus(secret)) if form}


def redact_text(text: str, *urls: str) -> str:
    """``text`` with every secret of ``urls`` masked wherever it appears, and every URL in it redacted."""
    secrets = {secret for url in urls for secret in _secrets(url)}
    for secret in sorted(secrets, key=len, reverse=True):  # the longest first: "p%40ss" before "p"
        text = text.replace(secret, MASK)
    return _URL_IN_TEXT.sub(lambda match: redact(match.group()), text)
