"""``kvstores check`` under the hood: run one suite on a resolved target through pytest, report per group.

The target reaches the checks through the ``check_target`` fixture of :class:`CheckPlugin`
(a pytest plugin object handed to ``pytest.main``), never through the environment.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from kvstores._urls import redact, redact_text
from kvstores.conformance import SUITE_MODULES
from kvstores.conformance._base import required_by
from kvstores.targets import Target

__all__ = ["CheckPlugin", "Result", "run"]

_CLASSES = {
    ("kv", "store"): "TestKV",
    ("events", "store"): "TestEvents",
    ("events", "event_store"): "TestEventStore",
    ("fastmcp", "store"): "TestFastMCP",
    ("tasks", "store"): "TestTasks",
}
"""(suite, what the target makes) -> test class in kvstores.conformance._check."""

_REASON_LENGTH = 300


@dataclass
class Result:
    """The outcome of one check."""

    check: str
    group: str
    outcome: str
    """"passed", "failed" or "skipped"."""
    reason: str
    """Why it failed (the assertion message or the exception) or was skipped; empty when it passed."""
    needs: list[str]
    """The optional capabilities the check needs (empty: only the core protocol)."""


def _group(check: str) -> str:
    """The word after ``test_``: the group a check belongs to."""
    return check.removeprefix("test_").split("_")[0]


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0].removeprefix("Failed: ") if lines else "failed"
    if line == "AssertionError" and len(lines) > 1:
        line = lines[1]
    return line if len(line) <= _REASON_LENGTH else line[: _REASON_LENGTH - 3] + "..."


class CheckPlugin:
    """Hands the target to the checks and collects one :class:`Result` per check."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.results: dict[str, Result] = {}
        self._needs: dict[str, list[str]] = {}

    @pytest.fixture
    def check_target(self) -> Target:
        """The target ``kvstores check`` resolved."""
        return self.target

    def pytest_configure(self, config: pytest.Config) -> None:
        pytest.register_assert_rewrite(*SUITE_MODULES)  # bare asserts of the suites say what they saw

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            self._needs[item.nodeid] = sorted(required_by(getattr(item, "function", None)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        check = report.nodeid.rpartition("::")[2]
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
            reason = "" if report.passed else redact_text(_reason(report), self.target.spec)
            self.results[check] = Result(check, _group(check), outcome, reason, self._needs.get(report.nodeid, []))
        elif report.when == "teardown" and report.failed and check in self.results:
            result = self.results[check]
            result.outcome = "failed"
            result.reason = result.reason or f"after the check: {redact_text(_reason(report), self.target.spec)}"


def render(target: Target, suite: str, results: list[Result]) -> str:
    """The report: counts per group, then each failed check and each group's skips, one line each."""
    lines = [f"kvstores check {redact(target.spec)} --suite {suite}"]
    if target.kind == "store":
        found = ", ".join(sorted(target.capabilities)) or "none"
        lines.append(f"{target.type_name}; optional capabilities: {found}")
    else:
        lines.append(f"{target.type_name} (an event store)")
    lines.append("")
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for result in results:
        counts[result.group][result.outcome] += 1
    lines.append(f"{'group':<14}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for group, count in sorted(counts.items()):
        lines.append(f"{group:<14}{count['passed']:>8}{count['failed']:>8}{count['skipped']:>9}")
    failed = [result for result in results if result.outcome == "failed"]
    if failed:
        lines += ["", "failed:"]
        for group in sorted({result.group for result in failed}):
            lines.append(f"  {group}")
            for result in (result for result in failed if result.group == group):
                needs = f"needs {', '.join(result.needs)}" if result.needs else "core"
                lines.append(f"    FAILED {result.check} [{needs}]: {result.reason}")
    skips = Counter((result.group, result.reason) for result in results if result.outcome == "skipped")
    if skips:
        lines += ["", "skipped:"]
        for (group, reason), skipped in sorted(skips.items()):
            lines.append(f"  {group}: {skipped} skipped: {reason}")
    total = Counter(result.outcome for result in results)
    lines += ["", f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"]
    return "\n".join(lines)


def run(target: Target, suite: str, *, verbose: bool = False, json_file: Path | None = None) -> int:
    """Run ``suite`` against ``target``; print the report; return the exit code (0: nothing failed)."""
    checks = Path(__file__).with_name("_check.py")  # not imported here: pytest imports it, rewriting asserts
    plugin = CheckPlugin(target)
    args = [
        f"{checks}::{_CLASSES[suite, target.kind]}",
        "-c",
        os.devnull,  # the working directory's pytest configuration is not the suite's
        "--rootdir",
        str(checks.parent),
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
    ]
    args += ["-v"] if verbose else ["-p", "no:terminal"]
    code = pytest.main(args, plugins=[plugin])
    results = list(plugin.results.values())
    print(("\n" if verbose else "") + render(target, suite, results))
    if json_file is not None:
        report = {
            "target": redact(target.spec),
            "suite": suite,
            "store": target.type_name,
            "capabilities": sorted(target.capabilities),
            "checks": [asdict(result) for result in results],
        }
        json_file.write_text(json.dumps(report, indent=2) + "\n")
    failed = code != 0 or any(result.outcome == "failed" for result in results)
    return 1 if failed or not results else 0
