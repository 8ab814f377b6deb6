"""The kvstores command: run the demo, check a store against the conformance suites, benchmark,
probe a store, look at and move a store's entries.

``kvstores demo [--store URL]`` shows FastMCP session state on a persistent store:
isolation, expiry and persistence across a server restart (see kvstores.demo); without
``--store`` it uses ``$KVSTORES_URL`` when set.
``kvstores bench [TARGET ...] [--compare] [--quick]`` measures stores (see kvstores.bench).

``kvstores check TARGET [--suite kv|events|fastmcp] [-v] [--json FILE]`` runs a conformance
suite through pytest against TARGET (a store URL such as ``sqlite:///scratch.db``, or
``package.module:factory``) and prints, per group of checks, what passed, each failed check
with why and the capability it needs, and what was skipped and why. It exits 0 only if
nothing failed, 2 when the target or an extra is missing. A factory may return any object
whose methods attribute access finds, on its class or through ``__getattr__``
(:func:`kvstores.implements`, the same on every Python). The target's data is destroyed by
the checks: use a scratch database.

``kvstores ping [TARGET]`` is a readiness probe: it exits 0 when the store (TARGET, or
``$KVSTORES_URL``) answered, 1 when it is unreachable, 2 when the target is bad.
``kvstores ls | get | put | delete | copy`` are the operator's commands (see kvstores._operator).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from pathlib import Path
from typing import NoReturn

from kvstores import _operator
from kvstores._optional import missing_extra
from kvstores._urls import redact_text
from kvstores.registry import URL_VARIABLE

__all__ = ["SUITES", "main"]

SUITES: dict[str, tuple[tuple[str, str], ...]] = {
    "kv": (("pytest", "check"), ("anyio", "check")),
    "events": (("pytest", "check"), ("anyio", "check"), ("mcp", "mcp")),
    "fastmcp": (("pytest", "check"), ("anyio", "check"), ("fastmcp", "fastmcp")),
    "tasks": (("pytest", "check"), ("anyio", "check"), ("fastmcp", "fastmcp")),
}
"""Each suite ``kvstores check`` runs, and the (package, extra) pairs it needs."""

_EPILOG = """examples:
  kvstores check sqlite:///scratch.db
  kvstores check redis://localhost:6379/15 --suite fastmcp --json report.json
  kvstores check mypackage.stores:make_store -v"""


def _missing(suite: str) -> ImportError | None:
    """The ImportError naming the extra to install, if a package ``suite`` needs is missing."""
    for package, extra in SUITES[suite]:
        try:
            importlib.import_module(package)
        except ImportError:
            return missing_extra(package, extra)
    return None


def check(target: str, suite: str, *, verbose: bool = False, json_file: Path | None = None) -> int:
    """Run ``suite`` against ``target``; print the report; return the exit code."""
    missing = _missing(suite)
    if missing is not None:
        print(f"kvstores check: {missing}", file=sys.stderr)
        return 2
    from kvstores.conformance._runner import run
    from kvstores.targets import TargetError, resolve

    try:
        resolved = asyncio.run(resolve(target, event_stores=suite == "events"))
    except TargetError as exc:
        print(f"kvstores check: {redact_text(str(exc), target)}", file=sys.stderr)
        return 2
    return run(resolved, suite, verbose=verbose, json_file=json_file)


def _demo_arguments(args: list[str]) -> list[str]:
    """The demo's arguments, with ``--store $KVSTORES_URL`` when no store is named and the variable is set."""
    url = os.environ.get(URL_VARIABLE)
    named = any(arg == "--store" or arg.startswith("--store=") for arg in args)
    return args if named or not url else ["--store", url, *args]


class _Parser(argparse.ArgumentParser):
    """argparse, with any URL in its error messages redacted ("unrecognized arguments: redis://...")."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``message`` without secrets; exit 2."""
        super().error(redact_text(message))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvstores`` console script."""
    parser = _Parser(prog="kvstores", description=__doc__.split("\n\n")[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser(
        "check",
        help="run a conformance suite against a store",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check_parser.add_argument("target", help="store URL (e.g. sqlite:///scratch.db) or package.module:factory")
    check_parser.add_argument("--suite", choices=sorted(SUITES), default="kv")
    check_parser.add_argument("-v", "--verbose", action="store_true", help="keep pytest's full output")
    check_parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results to FILE as JSON")
    commands.add_parser("demo", help="FastMCP session state on a persistent store", add_help=False)
    commands.add_parser("bench", help="benchmark stores against raw drivers and py-key-value", add_help=False)
    _operator.add_parsers(commands)
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["demo"]:
            from kvstores import demo

            return demo.main(_demo_arguments(args[1:]))
        if args[:1] == ["bench"]:
            from kvstores import bench

            return bench.main(args[1:])
    except ImportError as exc:  # a missing extra: the message names it
        print(f"kvstores {args[0]}: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    options = parser.parse_args(args)
    if options.command in _operator.COMMANDS:
        return _operator.run(options)
    return check(options.target, options.suite, verbose=options.verbose, json_file=options.json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
