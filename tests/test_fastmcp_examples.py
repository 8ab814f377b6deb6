"""The persistent_state example scripts and ``kvstores demo``, run as a user runs them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvstores.demo import main as demo_main
from tests.support.examples import ExampleServer, run_example, sections


def assert_alice_and_bob(output: str) -> None:
    """The handshake-session part of client.py / client_stdio.py output: Alice, Bob, Alice again."""
    found = sections(output)
    alice, bob, again = (
        found["Alice connects"],
        found["Bob connects (different session)"],
        found["Alice reconnects (new session)"],
    )
    assert alice[1:] == [
        "set user -> Stored 'user' = 'Alice'",
        "set secret -> Stored 'secret' = 'alice-password'",
        "get user -> 'user' = 'Alice'",
        "get secret -> 'secret' = 'alice-password'",
    ]
    assert bob[1:] == [
        "get user -> Key 'user' not found",
        "get secret -> Key 'secret' not found",
        "set user -> Stored 'user' = 'Bob'",
        "get user -> 'user' = 'Bob'",
    ]
    assert again[1:] == ["get user -> Key 'user' not found"]
    sessions = {alice[0], bob[0], again[0]}
    assert len(sessions) == 3 and all(re.fullmatch(r"session [0-9a-f]{8}", line) for line in sessions)


def created_session(output: str) -> str:
    """The explicit session id client.py / client_stdio.py created, checked across two connections."""
    lines = sections(output)["Explicit session (SessionProvider), any protocol mode"]
    match = re.fullmatch(r"connection 1: create_session -> ([0-9a-f-]{36})", lines[0])
    assert match, lines
    assert lines[1:] == [
        "connection 1: remember user -> Stored 'user' = 'Alice'",
        "connection 2: recall user -> 'user' = 'Alice'",
    ]
    return match.group(1)


def test_client_stdio_with_the_default_store(tmp_path: Path) -> None:
    output = run_example("client_stdio.py", cwd=tmp_path)
    assert_alice_and_bob(output)
    session_id = created_session(output)
    assert sections(output)[f"Explicit session {session_id[:8]}, after the server restarted"] == [
        "recall user -> 'user' = 'Alice'"
    ]
    assert (tmp_path / "persistent_state.db").exists()


def test_client_over_http_and_a_server_restart(tmp_path: Path) -> None:
    server = ExampleServer(None, tmp_path)
    try:
        server.wait_until_serving()
        output = run_example("client.py", "--url", server.url, cwd=tmp_path)
    finally:
        server.stop()
    assert_alice_and_bob(output)
    session_id = created_session(output)
    assert f"--session {session_id}" in output.splitlines()[-1]

    restarted = ExampleServer(None, tmp_path)
    try:
        restarted.wait_until_serving()
        again = run_example("client.py", "--url", restarted.url, "--session", session_id, cwd=tmp_path)
    finally:
        restarted.stop()
    assert sections(again) == {f"Explicit session {session_id[:8]}, read back": ["recall user -> 'user' = 'Alice'"]}


def test_demo_with_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert demo_main([]) == 0
    output = capsys.readouterr().out
    assert "sqlite:///kvstores-demo.db" in output
    assert (tmp_path / "kvstores-demo.db").exists()
    for shown in [
        "ok: sessions are isolated: Bob sees none of Alice's state",
        "ok: a reconnect starts a fresh session",
        "ok: FastMCP's one-day TTL reached the store",
        "ok: the state expired on its TTL",
        "ok: the session survived the server restart",
        "ok: the same session continued on server B",
        "ok: the state set on server A was read back on server B",
        "ok: a closed session is refused",
        "ok: server B knows the task at once, from the store: working",
        "and the client got its result",
        "all steps showed what they should",
        "kvstores dashboard sqlite:///kvstores-demo.db",
    ]:
        assert shown in output
    assert "UNEXPECTED" not in output
    assert output.count("server restarted") == 3
    # one session id throughout: opened on A, continued on B, refused on B after the DELETE
    scene, _, tasks = output[output.index("[servers A and B]") :].partition("background tasks:")
    # the task ran again on the server that was not killed, and its result names that server
    killed, survivor = re.findall(r"server (\w) is killed mid-task; .* to server (\w)'s worker", tasks)[0]
    assert killed != survivor and f"-> 'report written by server {survivor}'" in tasks, tasks
    session_ids = re.findall(r"session ([0-9a-f]{32})", scene)
    assert len(session_ids) == 3 and len(set(session_ids)) == 1, scene
    assert f"a request in session {session_ids[0]} -> 404" in scene


def test_demo_on_memory_says_the_session_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_main(["--store", "memory://"]) == 0
    assert "memory:// keeps nothing once closed, so the session is gone" in capsys.readouterr().out
