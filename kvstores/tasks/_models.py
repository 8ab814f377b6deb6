"""The wire shapes of the tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663).

The same shapes, field names and defaults as ``fastmcp-tasks`` 4.1.4 (its ``models.py``): a flat
``CreateTaskResult`` with ``resultType: "task"``, a ``GetTaskResult`` carrying exactly one of
``result`` / ``error`` / ``inputRequests`` beside the task's fields, and empty acknowledgements for
``tasks/update`` and ``tasks/cancel``. Dumped with ``by_alias=True, exclude_none=True`` by the
SDK's runner, so no ``_meta`` key is emitted (the published schema's task arm forbids it).
"""

from __future__ import annotations

from typing import Any, Literal

from mcp_types import RequestParams, Result
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MISSING_REQUIRED_CLIENT_CAPABILITY",
    "CancelTaskResult",
    "CreateTaskResult",
    "GetTaskParams",
    "GetTaskResult",
    "TaskStatus",
    "UpdateTaskParams",
    "UpdateTaskResult",
    "missing_capability_error_data",
]

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
"""A task's status on the wire."""


class _TaskFields(BaseModel):
    """The task fields every task result carries (the schema's ``Task``)."""

    model_config = ConfigDict(populate_by_name=True)

    task_id: str = Field(serialization_alias="taskId")
    status: TaskStatus
    created_at: str = Field(serialization_alias="createdAt")
    last_updated_at: str = Field(serialization_alias="lastUpdatedAt")
    ttl_ms: int | None = Field(serialization_alias="ttlMs")
    status_message: str | None = Field(default=None, serialization_alias="statusMessage")
    poll_interval_ms: int | None = Field(default=None, serialization_alias="pollIntervalMs")


class CreateTaskResult(_TaskFields):
    """What a ``tools/call`` run as a task answers: the task, ``resultType: "task"``."""

    result_type: Literal["task"] = Field(default="task", serialization_alias="resultType")


class GetTaskResult(_TaskFields):
    """What ``tasks/get`` answers: the task, with its result, error or input requests inlined."""

    result_type: Literal["complete"] = Field(default="complete", serialization_alias="resultType")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(default=None, serialization_alias="inputRequests")


class UpdateTaskResult(Result):
    """The acknowledgement of ``tasks/update``."""

    result_type: Literal["complete"] = Field(default="complete", serialization_alias="resultType")


class CancelTaskResult(Result):
    """The acknowledgement of ``tasks/cancel``."""

    result_type: Literal["complete"] = Field(default="complete", serialization_alias="resultType")


class GetTaskParams(RequestParams):
    """The params of ``tasks/get`` and ``tasks/cancel``: the task's id."""

    model_config = ConfigDict(populate_by_name=True)

    task_id: str = Field(alias="taskId")


class UpdateTaskParams(RequestParams):
    """The params of ``tasks/update``: the task's id and the client's answers."""

    model_config = ConfigDict(populate_by_name=True)

    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def missing_capability_error_data() -> dict[str, Any]:
    """The ``data`` of a -32021 error: the capability the client has to declare."""
    from fastmcp.utilities.tasks import TASKS_EXTENSION_ID

    return {"requiredCapabilities": {"extensions": {TASKS_EXTENSION_ID: {}}}}
