"""A background task's stored record: its states, the one table of their transitions, its typed form.

The record is the task's source of truth, kept under the SHA-256 of the task's id (:func:`ref`:
the id is a capability, so it is never a key, a signal or a log line). A terminal state is
final. ``from_json`` checks the layout version: a record of another version is an error
(:class:`TaskRecordError`), never a guess.

The engine writes every change through one compare-and-set that calls :func:`check_transition`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstores._lease import Lease
from kvstores.errors import KVStoreError

__all__ = [
    "RECORD_VERSION",
    "TRANSITIONS",
    "TaskRecord",
    "TaskRecordError",
    "TaskState",
    "check_transition",
    "label",
    "ref",
]

RECORD_VERSION = 2
"""The layout version of task records (1: keyed by the raw id, before 0.2)."""


class TaskState(enum.StrEnum):
    """A task's state, as the tasks extension names it on the wire."""

    WORKING = "working"
    """Runnable or running: queued for a worker, or leased by one."""
    INPUT_REQUIRED = "input_required"
    """The tool asked the client something; the task waits for ``tasks/update``."""
    COMPLETED = "completed"
    """The tool returned (its result may be an error result): final."""
    FAILED = "failed"
    """The task could not produce a result (a protocol error, a lost run-once attempt): final."""
    CANCELLED = "cancelled"
    """The client cancelled it: final."""

    @property
    def terminal(self) -> bool:
        """True for the states nothing changes afterwards."""
        return not TRANSITIONS[self]


TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.WORKING: frozenset(TaskState),
    TaskState.INPUT_REQUIRED: frozenset(
        {TaskState.INPUT_REQUIRED, TaskState.WORKING, TaskState.FAILED, TaskState.CANCELLED}
    ),
    TaskState.COMPLETED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}
"""The states each state may change to (itself included where a change keeps the state)."""


class TaskRecordError(KVStoreError):
    """A stored task record kvstores cannot read (another layout version, or corrupt)."""


def ref(task_id: str) -> str:
    """The key of a task: the SHA-256 of its id in hex (the id is a capability, never a key)."""
    return hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()


def label(task_ref: str) -> str:
    """How kvstores names a task to people (logs, CLI): ``#`` and the first 12 hex digits of its ref."""
    return "#" + task_ref[:12]


@dataclass(frozen=True)
class TaskRecord:
    """One task as stored: what to run, for whom, its state and outcome, and its lease."""

    id: str
    scope: str | None
    tool: str
    version: str | None
    arguments: dict[str, Any]
    caller: dict[str, Any]
    rerun: bool
    created: float
    updated: float
    ttl_ms: int
    poll_ms: int
    state: TaskState = TaskState.WORKING
    message: str | None = None
    progress: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    """The tool's result: in the record when small, else beside it (``result_token``; ``TaskEngine.read`` loads it)."""
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    input_keys: dict[str, str] | None = None
    request_state: str | None = None
    input_responses: dict[str, Any] | None = None
    lease: Lease | None = None
    token: int = 0
    attempts: int = 0
    result_token: int | None = None
    """Where a result kept beside the record is: under the token of the run that wrote it (None: in the record)."""

    @property
    def ref(self) -> str:
        """The task's key."""
        return ref(self.id)

    def held_by(self, token: int) -> bool:
        """True while the lease of fencing ``token`` holds the task (and the task is not final)."""
        return not self.state.terminal and self.lease is not None and self.lease.token == token

    def summary(self, now: float) -> dict[str, Any]:
        """What an operator sees of the task (``kvstores tasks``, the dashboard): its label, never its id,
        and nothing it carries for its tool (arguments, result, the caller's token and headers, answers)."""
        lease = self.lease
        return {
            "task": label(self.ref),
            "state": self.state.value,
            "tool": self.tool,
            "age": round(now - self.created, 3),
            "updated": round(now - self.updated, 3),
            "worker": None if lease is None else lease.holder,
            "lease_left": None if lease is None else round(lease.expires - now, 3),
            "attempts": self.attempts,
            "principal": self.scope,
            "message": self.message,
            "error": (self.error or {}).get("message"),
            "ttl_ms": self.ttl_ms,
        }

    def to_json(self) -> dict[str, Any]:
        """The record as stored."""
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data["state"] = self.state.value
        data["lease"] = None if self.lease is None else self.lease.to_json()
        return {"v": RECORD_VERSION, **data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], task_ref: str) -> TaskRecord:
        """The record stored under ``task_ref``; TaskRecordError for another version or a corrupt one."""
        version = data.get("v")
        if version != RECORD_VERSION:
            raise TaskRecordError(
                f"task record {label(task_ref)} has layout version {version!r}; this kvstores reads version "
                f"{RECORD_VERSION} (tasks written by another release are not carried over)"
            )
        try:
            fields = {field.name: data[field.name] for field in dataclasses.fields(cls)}
            fields["state"] = TaskState(fields["state"])
            fields["lease"] = Lease.from_json(fields["lease"])
            record = cls(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise TaskRecordError(f"task record {label(task_ref)} is corrupt: {type(exc).__name__}: {exc}") from exc
        if record.ref != task_ref:
            raise TaskRecordError(f"task record {label(task_ref)} is corrupt: it names another task")
        return record

    def entering(self, state: TaskState, **changes: Any) -> TaskRecord:
        """This record in ``state`` with ``changes`` (:func:`check_transition` is applied on write).

        Entering a terminal state releases the lease and drops what was left to answer; entering
        ``input_required`` releases the lease (the task waits for the client, not a worker).
        """
        if state.terminal:
            changes = {**changes, "lease": None, "input_requests": None}
        elif state is TaskState.INPUT_REQUIRED:
            changes = {"lease": None, **changes}
        return dataclasses.replace(self, state=state, **changes)


def check_transition(old: TaskState, new: TaskState) -> None:
    """Raise ValueError unless :data:`TRANSITIONS` lets a task go from ``old`` to ``new``."""
    if new not in TRANSITIONS[old]:
        raise ValueError(f"a task cannot go from {old.value} to {new.value}")
