"""Store options in URL query strings: taken out for the store, the rest left for the driver."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = ["flag", "split_url_options"]


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
