"""The dashboard's one page: ``page.html``, ``page.css`` and ``page.js`` beside this module, inlined into one response.

No build step and no external asset (no CDN, no font): the page works air-gapped. The script
polls ``api/state`` (the last sample) and ``api/tasks`` (one bounded page) every interval and
draws the charts as inline SVG. Everything from the store goes into the DOM as text
(``textContent``), never as HTML. The operator token, once typed in, lives in one variable of the
script (not in the DOM, a cookie or storage) and travels in the Authorization header only.
"""

from __future__ import annotations

import functools
import html
import json
from importlib.resources import files

__all__ = ["STATES", "render"]

STATES = ("working", "input_required", "completed", "failed", "cancelled", "sealed", "unreadable")
"""What the list's state filter offers: the task states, and records this dashboard cannot read."""


@functools.cache
def _asset(name: str) -> str:
    return files("kvstores.dashboard").joinpath(name).read_text(encoding="utf-8")


def render(*, nonce: str, base: str, interval: float, writable: bool, csrf: str) -> str:
    """The page, its inline script and style admitted by ``nonce``; ``base``: the URL path it is served under."""
    data = {"base": base, "interval": json.dumps(interval), "writable": json.dumps(writable), "csrf": csrf}
    page = _asset("page.html")
    replacements = {
        "{attributes}": " ".join(f'data-{name}="{html.escape(value, quote=True)}"' for name, value in data.items()),
        "{states}": "".join(f'<option value="{state}">{state.replace("_", " ")}</option>' for state in STATES),
        "{mode}": "operator token required to cancel" if writable else "read-only",
        "{mode_class}": "warn" if writable else "dim",
        "{nonce}": nonce,
    }
    for placeholder, value in replacements.items():
        page = page.replace(placeholder, value)
    return page.replace("{css}", _asset("page.css")).replace("{script}", _asset("page.js"))
