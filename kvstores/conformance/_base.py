"""What the conformance suites share: asyncio, abstract fixtures and capability-gated checks.

A check that needs an optional capability says so with :func:`requires`; it is skipped, with
the reason, when the store under test does not implement it. What a store implements is
:func:`kvstores.capabilities` (the one source of truth); a suite subclass may narrow it with
its ``capabilities`` class attribute. ``kvstores check`` reads the same declaration to print
the capability each failed check needs.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import pytest

from kvstores.protocol import CAPABILITIES, capabilities, protocol_methods

__all__ = [
    "Conformance",
    "StoreConformance",
    "abstract_fixture",
    "missing",
    "optional_fixture",
    "required_by",
    "requires",
]

Check = TypeVar("Check", bound=Callable[..., Awaitable[None]])

_REQUIRED = "__kvstores_requires__"


def requires(*names: str) -> Callable[[Check], Check]:
    """Mark a check as needing these capabilities (keys of ``kvstores.protocol.CAPABILITIES``).

    The check's class gives its subject fixture (``store`` unless it says otherwise) as a
    keyword argument; on a subject that lacks one of ``names`` the check is skipped.
    """
    unknown = sorted(set(names) - CAPABILITIES.keys())
    if unknown:
        raise ValueError(f"unknown capabilities {unknown}; known: {sorted(CAPABILITIES)}")

    def mark(check: Check) -> Check:
        @functools.wraps(check)
        async def gated(self: Conformance, **fixtures: Any) -> None:
            self.require(fixtures[self.subject], *names)
            await check(self, **fixtures)

        setattr(gated, _REQUIRED, frozenset(names))
        return gated  # type: ignore[return-value]

    return mark


def required_by(check: object) -> frozenset[str]:
    """The capabilities ``check`` was marked with by :func:`requires` (empty: the core protocol)."""
    required: frozenset[str] = getattr(check, _REQUIRED, frozenset())
    return required


def missing(name: str) -> str:
    """Why a store lacks capability ``name``: the methods its protocol asks for."""
    public = [f"{method}()" for method in protocol_methods(CAPABILITIES[name]) if not method.startswith("_")]
    return f"the store has no {', '.join(public)}"


def abstract_fixture(doc: str) -> Any:
    """A fixture each subclass must define; until it does, the checks error out naming it."""

    def fixture(self: object, request: pytest.FixtureRequest) -> Any:
        raise NotImplementedError(f"define a `{request.fixturename}` fixture in your {type(self).__name__} subclass")

    fixture.__doc__ = doc
    return pytest.fixture(fixture)


def optional_fixture(doc: str, reason: str) -> Any:
    """A fixture a subclass may define; until it does, the checks that take it are skipped with ``reason``."""

    def fixture(self: object) -> Any:
        pytest.skip(reason)

    fixture.__doc__ = doc
    return pytest.fixture(fixture)


class Conformance:
    """Base of every suite: runs the checks on asyncio and gates them by capability."""

    pytestmark: ClassVar = [pytest.mark.anyio]

    subject: ClassVar[str] = "store"
    """The fixture that yields what the suite checks (and whose capabilities :func:`requires` reads)."""
    capabilities: ClassVar[frozenset[str] | None] = None
    """The optional capabilities to check; None: every one the store implements (``kvstores.capabilities``).

    Set it to claim less than the store implements, e.g. ``capabilities = frozenset({"keys"})``.
    """

    @pytest.fixture
    def anyio_backend(self) -> str:
        """Run the suite on asyncio."""
        return "asyncio"

    def has(self, store: object, name: str) -> bool:
        """True if ``store`` has capability ``name`` and this suite checks it."""
        return name in capabilities(store) and (self.capabilities is None or name in self.capabilities)

    def require(self, store: object, *names: str) -> None:
        """Skip the running check, saying why, unless ``store`` has every capability in ``names``."""
        for name in names:
            if name not in capabilities(store):
                pytest.skip(missing(name))
            if self.capabilities is not None and name not in self.capabilities:
                pytest.skip(f"{type(self).__name__}.capabilities leaves out {name!r}")


class StoreConformance(Conformance):
    """Base of the suites that check a store: the ``store`` and ``peer_store`` fixtures they take."""

    store = abstract_fixture("The store under test, on an empty namespace: override this fixture.")
    peer_store = optional_fixture(
        "A second store object on the same namespace as ``store``: override to enable.",
        "no peer_store fixture: the checks across two store objects are not run",
    )
