"""A FastMCP app with kvstores.tasks on the store at $KVSTORES_URL.

For ``kvstores worker tests.support.task_app:mcp`` (tests/test_tasks.py).
"""

from __future__ import annotations

import os

from kvstores import open_store
from tests.support.tasks import build_server

mcp = build_server(open_store(os.environ["KVSTORES_URL"]))
"""The app (its tools: tests/support/tasks.py)."""
