"""The kvstores command: run the demo, check a store against the conformance suites, benchmark.

``kvstores demo [--store URL]`` shows FastMCP session state on a persistent store:
isolation, expiry and persistence across a server restart (see kvstores.demo).
``kvstores bench [TARGET ...] [--compare] [--quick]`` measures stores (see kvstores.bench).

``kvstores check TARGET [--suite kv|events|fastmcp]`` runs a suite through pytest against TARGET (a store
URL such as ``sqlite:///scratch.db`` or ``package.module:factory``) and prints a summary
per group of checks. It exits 0 only if nothing failed. The target's kvstores data is
destroyed by the checks: use a scratch database.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["main"]

SUITES = {"kv": "TestKV", "events": "TestEvents", "fastmcp": "TestFastMCP"}
_SUITE_MODULES = {"events": "kvstores.conformance.events", "fastmcp": "kvstores.conformance.fastmcp"}
"""Suite name -> test class in kvstores.conformance._check."""


class _Summary:
    """A pytest plugin that tallies results per group (the word after ``test_``)."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.skips: dict[str, str] = {}
        self.failures: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.rpartition("::")[2]
        group = name.split("_")[1] if name.count("_") >= 1 else name
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.counts[group][report.outcome] += 1
            if report.skipped:
                self.skips[name] = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else "skipped"
            elif report.failed:
                self.failures.append(name)
        elif report.when == "teardown" and report.failed:
            self.counts[group]["failed"] += 1
            self.failures.append(f"{name} (teardown)")

    def render(self) -> str:
        lines = [f"{'group':<14}{'passed':>8}{'failed':>8}{'skipped':>9}"]
        for group, counts in sorted(self.counts.items()):
            lines.append(f"{group:<14}{counts['passed']:>8}{counts['failed']:>8}{counts['skipped']:>9}")
        lines += [f"skipped {name}: {reason}" for name, reason in sorted(self.skips.items())]
        lines += [f"FAILED {name}" for name in self.failures]
        return "\n".join(lines)


def check(target: str, suite: str, verbose: bool = False) -> int:
    """Run ``suite`` against ``target``; print the summary; return the exit code."""
    import pytest

    from kvstores.conformance.targets import TARGET_VARIABLE

    os.environ[TARGET_VARIABLE] = target  # before _check is imported: its classes read it
    if suite in _SUITE_MODULES:
        importlib.import_module(_SUITE_MODULES[suite])  # fail early, naming the extra to install
    from kvstores.conformance import _check
    summary = _Summary()
    args = [
        f"{Path(_check.__file__)}::{SUITES[suite]}",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(Path(_check.__file__).parent),
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "-v" if verbose else "-q",
    ]
    code = pytest.main(args, plugins=[summary])
    print(f"\nkvstores check {target} --suite {suite}")
    print(summary.render())
    return 0 if code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvstores`` console script."""
    parser = argparse.ArgumentParser(prog="kvstores", description=__doc__.split("\n\n")[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="run a conformance suite against a store")
    check_parser.add_argument("target", help="store URL (e.g. sqlite:///scratch.db) or package.module:factory")
    check_parser.add_argument("--suite", choices=sorted(SUITES), default="kv")
    check_parser.add_argument("-v", "--verbose", action="store_true", help="list every test")
    commands.add_parser("demo", help="FastMCP session state on a persistent store", add_help=False)
    commands.add_parser("bench", help="benchmark stores against raw drivers and py-key-value", add_help=False)
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from kvstores import demo

        return demo.main(args[1:])
    if args[:1] == ["bench"]:
        from kvstores import bench

        return bench.main(args[1:])
    options = parser.parse_args(args)
    return check(options.target, options.suite, options.verbose)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
