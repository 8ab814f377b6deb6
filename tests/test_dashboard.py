"""``kvstores dashboard`` over HTTP: what it shows (and never shows), its guards, its bounded reads.

Real stores (SQLite files, the machine's Redis), real ``kvstores dashboard`` processes on loopback
ports (each checked to exit 0 with nothing on stderr), httpx as the client. The browser's side is
tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import anyio
import httpx
import pytest

from kvstores import open_store
from kvstores._sealing import generate_key
from kvstores.dashboard import app
from kvstores.dashboard._collect import Collector
from kvstores.tasks import TaskEngine, TaskState
from kvstores.tasks._claims import INLINE_RESULT_BYTES
from tests.support import Backend
from tests.support.dashboard import OPERATOR_TOKEN, ROOT, SECRET, assert_no_secret, dashboard, seed, seed_many
from tests.support.fixtures import rows

pytestmark = pytest.mark.anyio


def _csrf(page: str) -> str:
    found = re.search(r'data-csrf="([^"]*)"', page)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("backend", rows("sqlite", "redis"), indirect=True)
async def test_the_state_tasks_and_a_task_show_no_secret(backend: Backend, namespace: str, store: Any) -> None:
    seeded = await seed(store)
    target = (
        backend.url_with_password(namespace, f"{SECRET}-url-password")
        if backend.server
        else backend.full_url(namespace)
    )
    with dashboard(target) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            page = await client.get("/")
            state = (await client.get("/api/state")).json()
            listing = await client.get("/api/tasks")
            detail = await client.get("/api/tasks/" + seeded.running[0].replace("#", "%23"))
            stuck = await client.get("/api/tasks/" + seeded.stuck[0].replace("#", "%23"))
            completed = await client.get("/api/tasks", params={"state": "completed"})
            missing = await client.get("/api/tasks/%23000000000000")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert not re.search(r'(src|href)="(https?:)?//', page.text), "the page loads nothing from elsewhere"
    assert state["tasks"]["complete"] and state["tasks"]["total"] == 7
    assert state["tasks"]["states"]["completed"] == len(seeded.done)
    assert [row["task"] for row in state["tasks"]["stuck"]] == seeded.stuck
    assert "lease expired" in state["tasks"]["stuck"][0]["stuck"]
    assert (state["sessions"]["live"], state["sessions"]["terminated"]) == (2, 1)
    assert (state["events"]["streams"], state["events"]["events"]) == (3, 3)
    assert state["store"]["encryption"] is False
    if backend.server:
        assert "***@" in state["store"]["url"]
    labels = [row["task"] for row in listing.json()["rows"]]
    assert labels == sorted(labels) and set(seeded.running + seeded.done + seeded.queued + seeded.stuck) == set(labels)
    assert {row["task"] for row in completed.json()["rows"]} == set(seeded.done)
    running = detail.json()
    assert running["state"] == "working" and running["worker"] and running["message"].startswith("step 2 of 5")
    assert [attempt["token"] for attempt in running["history"]] == [1]
    assert stuck.json()["stuck"] and stuck.json()["worker"] == "gone-worker"
    assert missing.status_code == 404
    for response in (page, listing, detail, stuck, completed):
        assert_no_secret(response.text, *seeded.secrets)
    assert_no_secret(str(state), *seeded.secrets)


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_requests_for_another_host_are_refused(backend: Backend, namespace: str, store: Any) -> None:
    await store.put("k", {"v": 1})  # the file exists: the dashboard never creates one
    with dashboard(backend.full_url(namespace)) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            for host in ("evil.example", f"evil.example:{served.port}", "127.0.0.1.evil.example", "[::2]"):
                for path in ("/", "/api/state", "/api/tasks"):
                    refused = await client.get(path, headers={"Host": host})
                    assert refused.status_code == 421, (host, path)
                    assert "x-frame-options" in refused.headers
            assert (await client.get("/", headers={"Host": f"localhost:{served.port}"})).status_code == 200
            assert (await client.get("/", headers={"Host": f"[::1]:{served.port}"})).status_code == 200


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_cancelling_needs_the_token_the_csrf_value_and_this_origin(
    backend: Backend, namespace: str, store: Any
) -> None:
    seeded = await seed(store)
    label = seeded.running[0]
    path = "/api/tasks/" + label.replace("#", "%23") + "/cancel"
    with dashboard(backend.full_url(namespace), token=OPERATOR_TOKEN) as served:
        origin = {"Origin": served.url}
        async with httpx.AsyncClient(base_url=served.url) as client:
            csrf = _csrf((await client.get("/")).text)
            bearer = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
            refused = [
                await client.post(path, headers={"X-CSRF-Token": csrf, **origin}),
                await client.post(
                    path, headers={"Authorization": "Bearer wrong-token-0123456789", "X-CSRF-Token": csrf, **origin}
                ),
                await client.post(path, headers={**bearer, **origin}),
                await client.post(path, headers={**bearer, "X-CSRF-Token": "forged", **origin}),
                await client.post(path, headers={**bearer, "X-CSRF-Token": csrf, "Origin": "http://evil.example"}),
                await client.post(path, headers={**bearer, "X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"}),
                await client.post(path, headers={**bearer, "X-CSRF-Token": csrf}),  # no origin at all
            ]
            assert [response.status_code for response in refused] == [403] * len(refused)
            assert (await TaskEngine(store).records([await _ref(store, label)]))[0].state is TaskState.WORKING
            cancelled = await client.post(path, headers={**bearer, "X-CSRF-Token": csrf, **origin})
            assert (await client.get("/api/tasks/" + label.replace("#", "%23"))).json()["state"] == "cancelled"
    assert cancelled.status_code == 200 and cancelled.json() == {"task": label, "state": "cancelled"}
    assert (await TaskEngine(store).records([await _ref(store, label)]))[0].state is TaskState.CANCELLED
    for response in [*refused, cancelled]:
        assert_no_secret(response.text, OPERATOR_TOKEN, *seeded.secrets)


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_a_read_only_dashboard_cancels_nothing(backend: Backend, namespace: str, store: Any) -> None:
    seeded = await seed(store)
    label = seeded.running[0]
    with dashboard(backend.full_url(namespace)) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            page = (await client.get("/")).text
            response = await client.post(
                "/api/tasks/" + label.replace("#", "%23") + "/cancel",
                headers={
                    "Authorization": f"Bearer {OPERATOR_TOKEN}",
                    "X-CSRF-Token": _csrf(page),
                    "Origin": served.url,
                },
            )
    assert response.status_code == 403 and "read-only" in response.json()["error"]
    assert 'data-writable="false"' in page
    assert (await TaskEngine(store).records([await _ref(store, label)]))[0].state is TaskState.WORKING


async def _ref(store: Any, label: str) -> str:
    keys = await store.keys("kvstores-tasks", limit=1, after=label[1:])
    assert keys and keys[0].startswith(label[1:])
    return str(keys[0])


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_thousands_of_tasks_are_counted_in_bounded_steps_and_paged(
    backend: Backend, namespace: str, store: Any
) -> None:
    labels = await seed_many(store, 2_500)
    with dashboard(backend.full_url(namespace)) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            first = (await client.get("/api/state")).json()["tasks"]
            assert not first["complete"] and first["total"] == 500  # one page of keys per sample
            for _ in range(200):  # a sample every 0.5 s: five of them sweep 2,500 records
                counted = (await client.get("/api/state")).json()["tasks"]
                if counted["complete"]:
                    break
                await anyio.sleep(0.1)
            assert counted["complete"] and counted["total"] == 2_500
            assert counted["states"] == {
                "working": 500,
                "input_required": 500,
                "completed": 500,
                "failed": 500,
                "cancelled": 500,
            }
            seen: list[str] = []
            after = None
            for _ in range(60):
                page = (await client.get("/api/tasks", params={"after": after} if after else {})).json()
                assert len(page["rows"]) <= 50 and page["scanned"] <= 5 * 200
                seen += [row["task"] for row in page["rows"]]
                after = page["next"]
                if after is None:
                    break
            failed = (await client.get("/api/tasks", params={"state": "failed", "tool": "bulk1"})).json()
    assert seen == sorted(labels) and len(seen) == 2_500
    assert {row["state"] for row in failed["rows"]} == {"failed"} and {row["tool"] for row in failed["rows"]} == {
        "bulk1"
    }
    assert failed["scanned"] <= 1_000


def _run(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    environment = {key: value for key, value in os.environ.items() if key != "KVSTORES_DASHBOARD_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "kvstores.cli", "dashboard", *arguments],
        cwd=ROOT,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("arguments", "env", "says"),
    [
        (("--host", "0.0.0.0", "--allow-host", "ops.example"), {}, "needs an operator token"),
        (("--host", "10.1.2.3"), {}, "needs an operator token"),
        (("--host", "0.0.0.0"), {"KVSTORES_DASHBOARD_TOKEN": OPERATOR_TOKEN}, "--allow-host"),
        ((), {"KVSTORES_DASHBOARD_TOKEN": f"{SECRET}-short"}, "at least 16 characters"),
    ],
)
def test_an_unsafe_command_line_is_refused(
    tmp_path: Any, arguments: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    ran = _run(f"sqlite:///{tmp_path / 'never.db'}", *arguments, env=env)
    assert ran.returncode == 2, ran
    assert ran.stdout == ""
    lines = ran.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvstores dashboard: ") and says in lines[0], ran.stderr
    assert SECRET not in ran.stderr
    assert not (tmp_path / "never.db").exists()


def test_an_unreachable_store_is_one_line_without_its_password() -> None:
    from tests.support import free_port

    ran = _run(f"redis://app:{SECRET}-url-password@127.0.0.1:{free_port()}/0?timeout=1")
    assert ran.returncode == 1, ran
    assert ran.stdout == "" and len(ran.stderr.splitlines()) == 1 and ran.stderr.startswith("kvstores dashboard: ")
    assert SECRET not in ran.stderr


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_encryption_shows_key_ids_and_names_the_missing_one(backend: Backend, namespace: str, store: Any) -> None:
    mine, other = generate_key(), generate_key()
    url = backend.full_url(namespace)
    async with open_store(url, encryption_keys=[mine]) as sealed, open_store(url, encryption_keys=[other]) as foreign:
        seeded = await seed(sealed)
        stranger = await TaskEngine(foreign).submit(
            tool="foreign", version=None, arguments={"a": f"{SECRET}-x"}, scope=None, caller={}, poll_interval_ms=100
        )
        mine_id, other_id = sealed.encryption_key_ids[0], foreign.encryption_key_ids[0]
    with dashboard(url, env={"KVSTORES_ENCRYPTION_KEYS": mine}) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            state = (await client.get("/api/state")).json()
            listing = await client.get("/api/tasks", params={"state": "sealed"})
            detail = await client.get("/api/tasks/%23" + stranger.ref[:12])
    assert state["store"]["encryption"] is True and state["store"]["key_ids"] == [mine_id]
    assert state["tasks"]["sealed"] == {other_id: 1} and state["tasks"]["total"] == 8
    assert [row["sealed"] for row in listing.json()["rows"]] == [other_id]
    assert detail.json()["state"] == "sealed" and detail.json()["sealed"] == other_id
    for text in (str(state), listing.text, detail.text):
        assert mine not in text and other not in text
        assert_no_secret(text, stranger.id, *seeded.secrets)


class _Counting:
    """A store that records the size of every listing and bulk read asked of it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.listings: list[int | None] = []
        self.reads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def keys(self, collection: str | None = None, *, limit: int | None = None, after: str | None = None) -> Any:
        self.listings.append(limit)
        return await self.store.keys(collection, limit=limit, after=after)

    async def get_many(self, keys: Any, *, collection: str | None = None) -> Any:
        self.reads.append(len(keys))
        return await self.store.get_many(keys, collection=collection)


async def test_every_read_is_a_bounded_page_and_viewers_share_samples() -> None:
    from kvstores import MemoryStore

    async with MemoryStore() as memory:
        engine = TaskEngine(memory)
        for index in range(1_100):
            record = await engine.submit(
                tool=f"tool{index % 3}", version=None, arguments={}, scope=None, caller={}, poll_interval_ms=100
            )
            if index % 2:
                claim = await engine.claim(record.ref)
                result = {"n": index, "padding": "x" * INLINE_RESULT_BYTES}  # kept beside the record
                assert claim is not None and await engine.finish(claim, TaskState.COMPLETED, result=result)
        counting = _Counting(memory)
        collector = Collector(counting, interval=3_600, page=500)
        first = await collector.snapshot()
        assert await collector.snapshot() is first  # within the interval: the same sample, no store call
        collector.interval = 0
        sweeps = [first]
        while not sweeps[-1]["tasks"]["complete"]:
            assert len(sweeps) < 10
            sweeps.append(await collector.snapshot())
        assert sweeps[-1]["tasks"]["total"] == 1_100 and sweeps[-1]["tasks"]["states"]["completed"] == 550
        assert len(sweeps) == 4  # 1,100 records and their 550 results: four pages of at most 500 keys
        page = await collector.tasks.page(None, "completed", "tool1")
        assert len(page["rows"]) == 50 and page["next"] is not None
        following = await collector.tasks.page(page["next"], "completed", "tool1")
        assert {row["task"] for row in following["rows"]}.isdisjoint(row["task"] for row in page["rows"])
        await collector.aclose()
    assert counting.listings and all(limit is not None and limit <= 500 for limit in counting.listings)
    assert counting.reads and max(counting.reads) <= 500


async def test_the_app_mounts_under_a_prefix() -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from kvstores import MemoryStore

    async with MemoryStore() as memory:
        outer = Starlette(routes=[Mount("/ops", app(memory))])
        transport = httpx.ASGITransport(app=outer)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            page = await client.get("/ops/")
            state = await client.get("/ops/api/state")
            refused = await client.get("/ops/", headers={"Host": "rebound.example"})
    assert page.status_code == 200 and 'data-base="/ops/"' in page.text
    assert state.json()["store"]["backend"] == "MemoryStore"
    assert refused.status_code == 421
    with pytest.raises(ValueError, match="16 characters"):
        app(memory, token="short")


def test_the_events_collection_is_the_event_stores() -> None:
    from kvstores.dashboard._census import EVENTS_COLLECTION
    from kvstores.events import EVENTS_COLLECTION as used

    assert used == EVENTS_COLLECTION


def test_the_demo_ends_with_the_dashboard_command_of_its_store() -> None:
    from kvstores.demo import _dashboard_command

    assert _dashboard_command("sqlite:///demo state.db") == "kvstores dashboard 'sqlite:///demo state.db'"
    command = _dashboard_command(f"redis://app:{SECRET}@cache:6379/0")
    assert command == "kvstores dashboard 'redis://app:***@cache:6379/0'" and SECRET not in command


def test_what_counts_as_stuck() -> None:
    import dataclasses
    import time

    from kvstores._lease import Lease
    from kvstores.dashboard import Limits
    from kvstores.dashboard._tasks import stuck
    from kvstores.tasks import TaskRecord

    now = time.time()
    fresh = TaskRecord("id", None, "tool", None, {}, {}, True, now - 5, now - 5, 900_000, 100)
    limits = Limits()
    assert stuck(fresh, now, limits) is None  # queued a moment ago
    unclaimed = dataclasses.replace(fresh, updated=now - limits.unclaimed - 1)
    assert "unclaimed" in (stuck(unclaimed, now, limits) or "")
    leased = dataclasses.replace(fresh, lease=Lease("w", 1, now - 1), token=1, attempts=1)
    assert stuck(leased, now, limits) is None  # lapsed a second ago: within the grace a take-over needs
    lapsed = dataclasses.replace(leased, lease=Lease("w", 1, now - limits.lease_grace - 1))
    assert "lease expired" in (stuck(lapsed, now, limits) or "")
    waiting = dataclasses.replace(fresh, state=TaskState.INPUT_REQUIRED, updated=now - 60)
    assert stuck(waiting, now, limits) is None
    assert "input" in (stuck(dataclasses.replace(waiting, updated=now - limits.input_wait - 1), now, limits) or "")
    done = dataclasses.replace(unclaimed, state=TaskState.COMPLETED)
    assert stuck(done, now, limits) is None
