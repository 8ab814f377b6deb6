"""A pytest plugin: a test that leaves an unclosed socket, transport, file or event loop fails itself.

pyproject turns warnings into errors. A resource nobody closed warns (ResourceWarning) when it is
freed, and one held in a reference cycle is freed only when the garbage collector runs, in whatever
test happens to be running then: that unrelated test failed. Here, after each test's teardown, the
garbage is collected with warnings recorded, and every ResourceWarning (and any other exception
raised by a finalizer, or a pending task destroyed) fails the test that left it, as an error at its
teardown that names the test and, with tracemalloc on (``PYTHONTRACEMALLOC=20``, for one test: it slows
the suite several times), where the leaked object was allocated. (Only for an object the collector freed:
CPython re-traces an object its finalizer resurrects, so one freed with the test's fixture values shows
where it was freed. The test is named either way.)

Cost and exactness: a full collection after every test, so each test's garbage is freed before the
next test starts (a young-generation collection would miss cycles that lived long enough to reach
the old generation, and name a later test). What keeps it cheap is ``gc.freeze()`` once collection
is done: the modules, test items and everything else alive then move to a generation the collector
never scans again, so each collection walks only what was allocated since (session servers and
their clients among it): about 2 ms a test where a full collection took 80 ms (test_conformance's
memory and SQLite rows), and the automatic collections during the tests get cheaper too. Objects
alive at the freeze that later become cyclic garbage are never freed; they are the import-time heap,
which the process keeps to its end anyway.

A failed test is no exception: pytest keeps its error for a post-mortem (``sys.last_value`` and
its traceback, which holds the test's frames and so everything the test opened) until the next
failure; the check lets go of it first. A child process still running when its ``Popen`` is freed
is killed once reported, so that it neither loads nor outlives the tests after it.

Open descriptors are not counted: session fixtures' servers (some in this process, on threads of
their own) open and close sockets for other tests' clients whenever their threads get to it, so a
count before and after a test is not exact on a shared loopback.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Generator, Iterator
from contextlib import contextmanager

import pytest

__all__ = ["collect_leaks", "pytest_collection_finish", "pytest_runtest_teardown"]


class _Recorder(logging.Handler):
    """Records what asyncio logs while the garbage is collected (a task destroyed while pending)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message += f"\n  {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        self.messages.append(message)


def _allocated_at(source: object) -> str:
    """Where ``source`` was allocated, when tracemalloc traces it."""
    if source is None or not tracemalloc.is_tracing():
        return ""
    trace = tracemalloc.get_object_traceback(source)
    if trace is None:
        return ""
    return "\n  allocated at (most recent call last):\n" + "\n".join(f"    {line}" for line in trace.format())


@contextmanager
def _recorded(leaks: list[str]) -> Iterator[None]:
    """Append to ``leaks`` every warning (ResourceWarning above all), finalizer exception and asyncio error of
    the block."""

    def unraisable(args: sys.UnraisableHookArgs) -> None:
        message = args.err_msg or "Exception ignored in"
        leaks.append(f"{message}: {args.object!r}: {args.exc_type.__name__}: {args.exc_value}")

    recorder = _Recorder()
    asyncio_logger = logging.getLogger("asyncio")
    asyncio_logger.addHandler(recorder)
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        sys.unraisablehook = previous_hook
        asyncio_logger.removeHandler(recorder)
    for warning in caught:  # any other warning a finalizer raised would have been an error too (pyproject)
        category = "" if issubclass(warning.category, ResourceWarning) else f"{warning.category.__name__}: "
        killed = " (killed)" if _kill(warning.source) else ""
        leaks.append(f"{category}{warning.message}{killed}{_allocated_at(warning.source)}")
    leaks.extend(recorder.messages)


def _kill(source: object) -> bool:
    """Kill and wait for ``source`` when it is a child process still running (a Popen nobody waited for)."""
    if not isinstance(source, subprocess.Popen) or source.poll() is not None:
        return False
    source.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        source.wait(timeout=10)
    return True


def collect_leaks(item: pytest.Item) -> list[str]:
    """Drop the fixture values ``item`` holds and collect the garbage; what the finalizers reported
    (unclosed resources, destroyed tasks). pytest lets go of those values only after the teardown's
    report, and what they leave unclosed would then be freed, and reported, in the next test."""
    leaks: list[str] = []
    with _recorded(leaks):
        if isinstance(item, pytest.Function):
            item.funcargs.clear()
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):  # a failure's frames, see above
            if hasattr(sys, name):
                delattr(sys, name)
        gc.collect()
    return leaks


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection left alive, so each test's collection scans only what came after."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """After the test's teardown, fail it for whatever it left to the garbage collector."""
    try:
        yield
    except BaseException as exc:
        leaks = collect_leaks(item)  # freed now, so that the next test is not blamed for them
        if leaks:
            exc.add_note(_message(item, nextitem, leaks))
        raise
    leaks = collect_leaks(item)
    if leaks:
        pytest.fail(_message(item, nextitem, leaks), pytrace=False)


def _message(item: pytest.Item, nextitem: pytest.Item | None, leaks: list[str]) -> str:
    listed = "\n".join(f"- {leak}" for leak in leaks)
    notes = []
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        notes.append("this teardown also ended the module's (or session's) fixtures: they may have left them")
    if not tracemalloc.is_tracing():
        notes.append("PYTHONTRACEMALLOC=20 shows where each was allocated")
    hints = "".join(f"\n({note})" for note in notes)
    return f"{item.nodeid} left {len(leaks)} resource(s) unclosed to the garbage collector:\n{listed}{hints}"
