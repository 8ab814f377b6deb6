"""The dashboard in a real browser: Debian's chromium (/usr/bin/chromium) driven by Playwright for Python.

Each test runs ``kvstores dashboard`` as a process on a store seeded with live tasks, durable sessions
and event streams, loads the page and waits on what it shows (Playwright's auto-waiting ``expect``).
Skipped when /usr/bin/chromium is missing, unless KVSTORES_REQUIRE names ``chromium`` (then it fails).

``KVSTORES_DASHBOARD_SCREENSHOT=docs/dashboard.png`` makes the SQLite run of the first test save the
README's screenshot there.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kvstores.tasks import TaskEngine, TaskState
from tests.support import Backend
from tests.support.dashboard import OPERATOR_TOKEN, SECRET, assert_no_secret, dashboard, seed, seed_many
from tests.support.fixtures import rows, skip_or_fail

pytestmark = pytest.mark.anyio

CHROMIUM = Path("/usr/bin/chromium")

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
expect.set_options(timeout=30_000)  # a loaded 2-core machine running 4 workers: waits on events, never on time


@pytest.fixture
def chromium() -> Path:
    """Debian's chromium: skip without it, or fail when KVSTORES_REQUIRE names ``chromium``."""
    if not CHROMIUM.exists():
        skip_or_fail("chromium", f"{CHROMIUM} is not installed (apt-get install chromium)")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Any]:
    """Debian's chromium, headless; ``rebound.test`` resolves to 127.0.0.1 in it (a DNS rebinding)."""
    async with playwright_api.async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(chromium), args=["--host-resolver-rules=MAP rebound.test 127.0.0.1"]
        )
        try:
            yield launched
        finally:
            await launched.close()


async def _ref(store: Any, label: str) -> str:
    keys = await store.keys("kvstores-tasks", limit=1, after=label[1:])
    assert keys and keys[0].startswith(label[1:])
    return str(keys[0])


async def _assert_no_secret_in_dom(page: Any, *secrets: str) -> None:
    assert_no_secret(await page.content(), *secrets)
    assert_no_secret(await page.evaluate("document.body.innerText"), *secrets)
    values = await page.evaluate("[...document.querySelectorAll('input')].map((i) => i.value).join(' ')")
    assert_no_secret(values, *secrets)


async def _screenshot(page: Any, store: Any, path: str) -> None:
    """The README's screenshot, after a minute's worth of samples of tasks coming and going."""
    from mcp.types import JSONRPCNotification

    from kvstores.events import StoreEventStore

    engine, events = TaskEngine(store), StoreEventStore(store)
    for step in range(24):
        for index in range(3):
            record = await engine.submit(
                tool=("analyze", "export", "report")[index],
                version=None,
                arguments={},
                scope=None,
                caller={},
                poll_interval_ms=100,
            )
            claim = await engine.claim(record.ref) if index < 2 or step % 4 == 0 else None
            if claim is not None and index == 0:
                await engine.finish(claim, TaskState.COMPLETED if step % 5 else TaskState.FAILED, result={"ok": 1})
        await events.store_event(f"stream{step % 5}", JSONRPCNotification(jsonrpc="2.0", method="note"))
        sampled = await page.locator("#live").get_attribute("data-sampled")
        await expect(page.locator("#live")).not_to_have_attribute("data-sampled", sampled or "")
    await page.screenshot(path=path)  # the viewport: the top of the list, not all fifty rows


@pytest.mark.parametrize("backend", rows("sqlite", "redis"), indirect=True)
async def test_the_page_is_live_shows_a_task_and_cancels_it_with_the_token(
    backend: Backend, namespace: str, store: Any, browser: Any
) -> None:
    seeded = await seed(store)
    target = (
        backend.url_with_password(namespace, f"{SECRET}-url-password")
        if backend.server
        else backend.full_url(namespace)
    )
    with dashboard(target, token=OPERATOR_TOKEN) as served:
        context = await browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = await context.new_page()
            problems: list[str] = []
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            await page.goto(served.url + "/")
            rows_shown = page.locator("#task-rows tr[data-task]")
            await expect(rows_shown).to_have_count(7)
            await expect(page.locator("#live")).to_contain_text("live")
            await expect(page.locator(f'tr.stuck[data-task="{seeded.stuck[0]}"]')).to_be_visible()
            await expect(page.locator("#attention")).to_contain_text("lease expired")
            await expect(page.locator("#sessions")).to_contain_text("terminated")
            await expect(page.locator("#events .num b").first).to_have_text("3")
            await expect(page.locator("#task-chart svg path").first).to_be_attached()

            # live: a task submitted now shows up without a reload
            fresh = await TaskEngine(store).submit(
                tool="fresh",
                version=None,
                arguments={"a": f"{SECRET}-late"},
                scope=None,
                caller={},
                poll_interval_ms=100,
            )
            await expect(page.locator(f'tr[data-task="#{fresh.ref[:12]}"]')).to_be_visible()

            # filters: state and tool
            await page.select_option("#filter-state", "completed")
            await expect(rows_shown).to_have_count(len(seeded.done))
            await page.select_option("#filter-state", "")
            await page.select_option("#filter-tool", "lost")
            await expect(rows_shown).to_have_count(1)
            await page.select_option("#filter-tool", "")

            # a task's detail, then cancelling it: refused without the token, done with it
            label = seeded.running[0]
            await page.click(f'tr[data-task="{label}"]')
            detail = page.locator("#detail")
            await expect(detail).to_be_visible()
            await expect(detail).to_contain_text("step 2 of 5")
            await expect(page.locator("#history li")).to_have_count(1)
            await expect(detail).to_contain_text("enter the operator token")
            status = await page.evaluate(
                """async (label) => (await fetch("api/tasks/" + encodeURIComponent(label) + "/cancel",
                    {method: "POST", headers: {"X-CSRF-Token": document.body.dataset.csrf}})).status""",
                label,
            )
            assert status == 403
            await page.fill("#token", "not-the-operator-token")
            await page.click("#unlock button")
            await expect(page.locator("#unlock-state")).to_contain_text("refused")
            await page.fill("#token", OPERATOR_TOKEN)
            await page.click("#unlock button")
            await expect(page.locator("#unlock-state")).to_have_text("unlocked")
            await page.click("#cancel")
            await expect(page.locator("#cancel")).to_contain_text("Really cancel")
            await page.click("#cancel")
            await expect(page.locator("#cancel-result")).to_have_text(f"{label}: cancelled")
            await expect(page.locator(f'tr[data-task="{label}"] td.state')).to_have_text("cancelled")
            assert (await TaskEngine(store).records([await _ref(store, label)]))[0].state is TaskState.CANCELLED
            await _assert_no_secret_in_dom(page, OPERATOR_TOKEN, fresh.id, *seeded.secrets)
            if os.environ.get("KVSTORES_DASHBOARD_SCREENSHOT") and backend.name == "sqlite":
                await page.click("#close")
                await _screenshot(page, store, os.environ["KVSTORES_DASHBOARD_SCREENSHOT"])
            assert [text for text in problems if "status of 403" not in text] == []  # the refusals above: 403
        finally:
            await context.close()


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_a_rebound_host_name_gets_nothing(backend: Backend, namespace: str, store: Any, browser: Any) -> None:
    seeded = await seed(store)
    with dashboard(backend.full_url(namespace)) as served:
        context = await browser.new_context()
        try:
            page = await context.new_page()
            refused = await page.goto(f"http://rebound.test:{served.port}/")
            assert refused is not None and refused.status == 421
            assert_no_secret(await page.content(), *seeded.secrets)
            assert "task" not in (await page.evaluate("document.body.innerText")).lower()
            served_page = await page.goto(f"http://localhost:{served.port}/")
            assert served_page is not None and served_page.status == 200
            await expect(page.locator("#mode")).to_have_text("read-only")
            await expect(page.locator("#unlock")).to_be_hidden()
            await page.click(f'tr[data-task="{seeded.running[0]}"]')
            await expect(page.locator("#detail")).to_contain_text("read-only")
            await expect(page.locator("#cancel")).to_have_count(0)
        finally:
            await context.close()


@pytest.mark.parametrize("backend", rows("redis"), indirect=True)
async def test_thousands_of_tasks_page_in_the_browser(
    backend: Backend, namespace: str, store: Any, browser: Any
) -> None:
    labels = await seed_many(store, 3_000)
    with dashboard(backend.full_url(namespace)) as served:
        context = await browser.new_context()
        try:
            page = await context.new_page()
            await page.goto(served.url + "/")
            shown = page.locator("#task-rows tr[data-task]")
            await expect(shown).to_have_count(50)
            await expect(page.locator("#task-scope")).to_have_text("· 3000")  # the first sweep is complete
            first = await shown.evaluate_all("(rows) => rows.map((row) => row.dataset.task)")
            await page.click("#next")
            await expect(shown.first).not_to_have_attribute("data-task", first[0])
            following = await shown.evaluate_all("(rows) => rows.map((row) => row.dataset.task)")
            assert len(following) == 50 and following == sorted(labels)[50:100]
            await page.click("#first")
            await expect(shown.first).to_have_attribute("data-task", first[0])
            assert first == sorted(labels)[:50]
            assert_no_secret(await page.content())
        finally:
            await context.close()
