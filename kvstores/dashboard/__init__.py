"""The operator's dashboard: one page showing a store's tasks, sessions, event streams, signals and latency.

::

    kvstores dashboard sqlite:///state.db            # http://127.0.0.1:8765/, read-only

    from kvstores.dashboard import app                # or mount it in your own ASGI app
    routes = [Mount("/ops", app(store, token=os.environ["OPS_TOKEN"]))]

Design decisions:

- **Bounded.** Nothing scans a whole collection per refresh. Counts come from a rolling census
  (:mod:`kvstores.dashboard._census`): each sample reads one page (``keys(collection, limit=,
  after=)``, then one ``get_many``) of tasks, of session records and of event keys, and a
  sweep's totals are published when it completes: exact at every sample for a store that fits
  in a page (500 entries), at most one sweep old otherwise. The task list is one page in label
  order, at most five pages of keys read to fill it when filtered, with a cursor to the next.
  A task's detail is one ``keys`` call and one read. Samples are taken at most once per
  interval (2 s) and shared by every open page, and so is each page of the list: viewers do
  not add load.
- **Stuck** (:func:`kvstores.dashboard._tasks.stuck`, thresholds in :class:`Limits`): a
  ``working`` task whose lease expired more than 5 s ago (its worker stopped renewing and none
  took it over), a ``working`` task unclaimed for 60 s since its last change (no worker is
  running), an ``input_required`` task unanswered for 10 minutes. Stuck tasks are listed first
  and highlighted in the list.
- **Attempts.** A record keeps only the count of its attempts; the dashboard remembers each
  lease it saw (fencing token, worker, when), so a task's history is what it watched, and the
  page says how many attempts ran before it started watching.
- **Secrets.** Tasks are named by label, session and stream ids by digests; arguments, results,
  callers, tokens, headers, input answers and event messages are never read into a response
  (event streams are counted from their keys alone). Store URLs are shown redacted; encryption
  shows key ids only, and a record sealed under a key the dashboard lacks is shown as such,
  naming the key id.
- **Guards** (:mod:`kvstores.dashboard._guard`): the Host of every request must be one the
  dashboard serves (DNS rebinding); without an operator token it is read-only; with one, the one
  action — cancel a task — needs the token in an ``Authorization: Bearer`` header (never a
  cookie: a browser does not send it by itself), the page's CSRF value in ``X-CSRF-Token``, and
  a same-origin ``Origin`` (or ``Sec-Fetch-Site: same-origin``). A strict Content-Security-Policy
  admits only the page's own inline script and style; no asset comes from anywhere else.
- **Writes.** Besides a cancel, the latency probe writes one entry (collection
  ``kvstores-dashboard``, a minute's TTL) and the signal probe publishes on a channel of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvstores.dashboard._collect import Collector
from kvstores.dashboard._guard import LOOPBACK_HOSTS
from kvstores.dashboard._tasks import Limits

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["LOOPBACK_HOSTS", "Limits", "app"]


def app(
    store: Any,
    *,
    token: str | None = None,
    allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
    url: str | None = None,
    interval: float = 2.0,
    limits: Limits | None = None,
) -> Starlette:
    """The dashboard of ``store`` as an ASGI (Starlette) app; the store stays the caller's to close.

    ``token``: the operator token that cancelling a task needs (None: read-only).
    ``allowed_hosts``: the host names requests may address it by (default: loopback names only).
    ``url``: the store's URL, shown redacted. ``interval``: seconds between two samples.
    ``limits``: when a task counts as stuck.
    """
    from kvstores.dashboard._app import build

    if token is not None and len(token) < 16:
        raise ValueError("the operator token must be at least 16 characters long")
    collector = Collector(store, url=url, interval=interval, limits=limits)
    return build(collector, token=token, hosts=allowed_hosts, close=True)
