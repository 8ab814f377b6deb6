"""Reporting: the console tables, the misses, BENCHMARKS.md's generated sections and the plots.

BENCHMARKS.md keeps its prose by hand; its tables are generated. Each generated section sits
between ``<!-- kvstores bench: NAME -->`` and ``<!-- /kvstores bench: NAME -->`` (NAME is one
of :data:`SECTIONS`), and :func:`update_markdown` rewrites what is between them from a results
document, e.g. ``kvstores bench --load benchmarks/results/bench.json --markdown benchmarks/BENCHMARKS.md``.
A document fills the sections of its kind only: a ``--batching-latency`` run's the
``batching-latency`` section (its rows and its targets), a ``--signals`` run's the ``signals``
section (likewise), an ``--e2e`` run's the ``e2e`` section (likewise), any other run's the others.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvstores._optional import missing_extra
from kvstores.bench._e2e import E2E_GROUP
from kvstores.bench._measure import STRING
from kvstores.bench._run import BATCHING_OFF
from kvstores.bench._scenarios import size_label
from kvstores.bench._signals import SIGNALS_GROUP
from kvstores.bench._tasks import TASKS_COLUMNS, TASKS_GROUP, tasks_lines

__all__ = ["SECTIONS", "markdown_sections", "misses", "plot", "print_tables", "update_markdown"]

_COLUMNS = ("operation", "value", "tasks", "ops/s", "p50 µs", "p99 µs", "cpu µs")
_BATCHING_COLUMNS = (
    "operation",
    "callers",
    "collections",
    "on p50 ms",
    "off p50 ms",
    "on/off p50",
    "on p99 ms",
    "off p99 ms",
    "on/off p99",
)
_SIGNALS_COLUMNS = (
    "operation",
    "streams",
    "events/s per stream",
    "contender",
    "p50 ms",
    "p99 ms",
    "events/s",
    "sent",
    "lost",
    "duplicated",
    "errors on A",
)
_E2E_COLUMNS = (
    "store",
    "sessions",
    "FastMCP calls/s",
    "durable calls/s",
    "ratio",
    "p50 ms",
    "p99 ms",
    "p99 ratio",
    "server CPU ms/call",
    "calls/s per round (F; D)",
)
_BATCHING = "batching"  # the group of the batching-through-latency rows
_OWN_SECTIONS = (
    _BATCHING,
    SIGNALS_GROUP,
    E2E_GROUP,
    TASKS_GROUP,
)  # groups whose rows and targets have a section of their own
_TEXT = frozenset({"worst row", "met"})


def _operation(row: dict[str, Any]) -> str:
    return f"{row['store']}.{row['operation']}" if row["group"] == "events" else str(row["operation"])


def _cells(row: dict[str, Any], baselines: list[str]) -> list[str]:
    """A row's cells under :data:`_COLUMNS` and one ``vs`` column per baseline."""
    cells = [_operation(row), size_label(row["value_bytes"], row.get("shape", STRING)), str(row["concurrency"])]
    if "skipped" in row:
        return [*cells, f"skipped: {row['skipped']}", *[""] * (len(_COLUMNS) - 4 + len(baselines))]
    ours = row["contenders"]["kvstores"]
    figures = [f"{ours['ops_per_second']:,.0f}", f"{ours['p50_us']:,.1f}", f"{ours['p99_us']:,.1f}"]
    cpu = f"{ours['cpu_us']:,.1f}" if "cpu_us" in ours else ""
    ratios = [f"{row['ratios'][b]:.2f}x" if b in row["ratios"] else "" for b in baselines]
    return [*cells, *figures, cpu, *ratios]


def _batching_cells(row: dict[str, Any]) -> list[str]:
    """A batching-through-latency row under :data:`_BATCHING_COLUMNS`: round times, on ÷ off."""
    cells = [str(row["operation"]), str(row["concurrency"]), str(row["collections"])]
    if "skipped" in row:
        return [*cells, f"skipped: {row['skipped']}", *[""] * (len(_BATCHING_COLUMNS) - 4)]
    on, off = row["contenders"]["kvstores"], row["contenders"][BATCHING_OFF]
    for metric in ("p50_us", "p99_us"):
        cells += [f"{on[metric] / 1e3:,.1f}", f"{off[metric] / 1e3:,.1f}", f"{on[metric] / off[metric]:.2f}"]
    return cells


def _signals_lines(row: dict[str, Any]) -> list[list[str]]:
    """A ``--signals`` row under :data:`_SIGNALS_COLUMNS`: one line per contender."""
    pace = f"{row['rate']:g}" if row.get("rate") else f"burst of {row['events_per_stream']}"
    cells = [str(row["operation"]), str(row["concurrency"]), pace]
    if "skipped" in row:
        return [[*cells, "", f"skipped: {row['skipped']}", *[""] * (len(_SIGNALS_COLUMNS) - 5)]]
    lines = []
    for name, figures in row["contenders"].items():
        latency = [f"{figures[key]:,.2f}" if key in figures else "-" for key in ("p50_ms", "p99_ms")]
        counts = [str(figures.get(key, 0)) for key in ("sent", "lost", "duplicated", "errors")]
        lines.append([*cells, name, *latency, f"{figures['events_per_second']:,.0f}", *counts])
        if "first_error" in figures:
            lines.append([*cells, name, f"first error on A: {figures['first_error']}", *[""] * 6])
        if "first_receiver_error" in figures:
            error = f"{figures['receiver_errors']} receivers on B raised, first: {figures['first_receiver_error']}"
            lines.append([*cells, name, error, *[""] * 6])
    lines += [[*cells, "", failure, *[""] * (len(_SIGNALS_COLUMNS) - 5)] for failure in row.get("failures", [])]
    return lines


def _e2e_cells(row: dict[str, Any]) -> list[str]:
    """An ``--e2e`` row under :data:`_E2E_COLUMNS`: FastMCP's app (F) -> durable sessions (D), medians of the rounds."""
    replicas = row.get("replicas", 1)
    cells = [f"{row['backend']}" + (f" x{replicas} (HAProxy)" if replicas > 1 else ""), str(row["concurrency"])]
    if "skipped" in row:
        return [*cells, f"skipped: {row['skipped'].splitlines()[0]}", *[""] * (len(_E2E_COLUMNS) - 3)]
    ours, theirs = row["contenders"]["kvstores"], row["contenders"]["fastmcp"]

    def pair(metric: str, scale: float, digits: int) -> str:
        if metric not in ours or metric not in theirs:
            return "-"
        return f"{theirs[metric] / scale:,.{digits}f} → {ours[metric] / scale:,.{digits}f}"

    rounds = "; ".join(
        ", ".join(f"{r['ops_per_second']:,.0f}" for r in figures["rounds"]) for figures in (theirs, ours)
    )
    return [
        *cells,
        f"{theirs['ops_per_second']:,.0f}",
        f"{ours['ops_per_second']:,.0f}",
        f"{row['ratios']['fastmcp']:.2f}x",
        pair("p50_us", 1e3, 1),
        pair("p99_us", 1e3, 1),
        f"{theirs['p99_us'] / ours['p99_us']:.2f}x",
        pair("cpu_us", 1e3, 2),
        rounds,
    ]


def _group(rows: list[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    return [row for row in rows if row["group"] == group]


def _split(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the batching-through-latency rows, the others but the ``--signals`` rows)."""
    return _group(rows, _BATCHING), [row for row in rows if row["group"] not in _OWN_SECTIONS]


def _by_url(rows: list[dict[str, Any]]) -> dict[str, tuple[list[dict[str, Any]], list[str]]]:
    """URL label -> (its rows, the baselines that appear in them)."""
    grouped: dict[str, tuple[list[dict[str, Any]], list[str]]] = {}
    for url in dict.fromkeys(row["target"] for row in rows):
        mine = [row for row in rows if row["target"] == url]
        grouped[url] = (mine, list(dict.fromkeys(name for row in mine for name in row.get("ratios", {}))))
    return grouped


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def misses(targets: list[dict[str, Any]]) -> list[str]:
    """One line per missed target: what it needs, what it got, and its worst row."""
    lines = []
    for result in targets:
        if result["met"]:
            continue
        if "maximum" in result:
            lines.append(_limit_miss(result))
            continue
        if result["median_ratio"] is None:
            got = f"not measured ({result['skipped_rows']} rows skipped or failed)"
        else:
            worst = f"worst {_ratio(result['worst_ratio'])} ({result['worst_row']})"
            got = f"median {_ratio(result['median_ratio'])}, {worst}"
        needs = f"needs >= {result['minimum']}x{' in every row' if result.get('every_row') else ''}"
        lines.append(f"{result['target']} on {result['url']}: {needs}, {got}")
    return lines


def _limit_miss(result: dict[str, Any]) -> str:
    needs = f"needs <= {result['maximum']:g} {result['unit']} in every row"
    if result["worst"] is None:
        got = f"not measured ({result['skipped_rows']} rows skipped or failed)"
    else:
        got = f"worst {result['worst']:g} {result['unit']} ({result['worst_row']})"
        if result["skipped_rows"]:
            got += f", {result['skipped_rows']} rows skipped or failed"
    return f"{result['target']} on {result['url']}: {needs}, {got}"


def _limit_cells(result: dict[str, Any]) -> list[str]:
    """A judged :class:`~kvstores.bench._targets.Limit`: target, URL, needs, worst, worst row, rows, met."""
    worst = "-" if result["worst"] is None else f"{result['worst']:g} {result['unit']}"
    return [
        result["target"],
        result["url"],
        f"<= {result['maximum']:g} {result['unit']}",
        worst,
        result["worst_row"] or "-",
        f"{result['rows']}" + (f" (+{result['skipped_rows']} skipped)" if result["skipped_rows"] else ""),
    ]


def _console() -> Any:
    try:
        from rich.console import Console
    except ImportError as exc:
        raise missing_extra("rich", "cli") from exc
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _print_per_url(
    console: Any,
    rows: list[dict[str, Any]],
    title: Callable[[str, list[dict[str, Any]]], str],
    columns: Sequence[str],
    lines: Callable[[dict[str, Any]], list[list[str]]],
    *,
    text: tuple[str, ...] = ("operation",),
) -> None:
    """One table per target URL of ``rows``: ``lines`` gives each row's lines under ``columns`` (``text`` ones
    align left)."""
    from rich.markup import escape
    from rich.table import Table

    for url, (mine, _) in _by_url(rows).items():
        table = Table(title=title(url, mine), title_justify="left")
        for column in columns:
            table.add_column(column, justify="left" if column in text else "right")
        for row in mine:
            for line in lines(row):
                table.add_row(*(escape(cell) for cell in line))
        console.print(table)


def print_tables(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> None:
    """Print one table per target URL (ours, then each baseline's ratio), then the targets and every miss."""
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    signals, tasks = _group(rows, SIGNALS_GROUP), _group(rows, TASKS_GROUP)
    end_to_end = _group(rows, E2E_GROUP)
    latency, rows = _split(rows)
    for url, (mine, baselines) in _by_url(rows).items():
        table = Table(title=f"kvstores bench {url}", title_justify="left")
        for column in (*_COLUMNS, *(f"vs {b}" for b in baselines)):
            table.add_column(column, justify="left" if column == "operation" else "right")
        for row in mine:
            table.add_row(*(escape(cell) for cell in _cells(row, baselines)))
        console.print(table)
    _print_per_url(
        console,
        latency,
        lambda url, _: f"kvstores bench --batching-latency {url} (round times; on/off above 1: batching on is slower)",
        _BATCHING_COLUMNS,
        lambda row: [_batching_cells(row)],
    )
    _print_per_url(
        console,
        signals,
        lambda url, mine: (
            f"kvstores bench --signals {url} (store -> follower on another replica; {mine[0].get('replicas')})"
        ),
        _SIGNALS_COLUMNS,
        _signals_lines,
        text=("operation", "contender"),
    )
    _print_per_url(
        console,
        end_to_end,
        lambda url, _: (
            f"kvstores bench --e2e {url} (FastMCP's own app → kvstores.sessions.http_app; above 1x: durable better)"
        ),
        _E2E_COLUMNS,
        lambda row: [_e2e_cells(row)],
        text=("store",),
    )
    _print_per_url(
        console,
        tasks,
        lambda url, _: (
            f"kvstores bench --tasks {url} (through a server process; ratios: kvstores tasks/s ÷ the contender's)"
        ),
        TASKS_COLUMNS,
        tasks_lines,
        text=("operation", "contender"),
    )
    limits = [result for result in targets if "maximum" in result]
    targets = [result for result in targets if "maximum" not in result]
    if limits:
        table = Table(title="limits (every row must keep them)", title_justify="left")
        for column in ("target", "url", "needs", "worst", "worst row", "rows", "met"):
            table.add_column(column, justify="left" if column in ("target", "url", "worst row") else "right")
        for result in limits:
            met = "yes" if result["met"] else "[bold red]NO[/]"
            table.add_row(*(escape(cell) for cell in _limit_cells(result)), met)
        console.print(table)
    for missed in misses(limits):
        console.print(f"[bold red]MISSED[/] {escape(missed)}")
    if not targets:
        return
    table = Table(title="targets (ratio = kvstores ÷ baseline; median over rows)", title_justify="left")
    for column in ("target", "url", "needs", "median", "worst", "worst row", "rows", "met"):
        table.add_column(column, justify="left" if column in ("target", "url", "worst row") else "right")
    for result in targets:
        table.add_row(
            escape(result["target"]),
            escape(result["url"]),
            f">= {result['minimum']}x",
            _ratio(result["median_ratio"]),
            _ratio(result["worst_ratio"]),
            escape(result["worst_row"] or ""),
            str(result["rows"]),
            "yes" if result["met"] else "[bold red]NO[/]",
        )
    console.print(table)
    for missed in misses(targets):
        console.print(f"[bold red]MISSED[/] {escape(missed)}")


def _table(header: list[str], lines: list[list[str]], text_columns: int) -> str:
    """A markdown table; columns whose header is in ``_TEXT`` or before ``text_columns`` align left."""
    rule = ["---" if index < text_columns or name in _TEXT else "---:" for index, name in enumerate(header)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in (header, rule, *lines))


def _targets_markdown(targets: list[dict[str, Any]], missed_intro: str = "Missed (see the profiles below):") -> str:
    if not targets:
        return "No targets were measured (run with `--compare`)."
    lines = [
        [
            result["target"],
            f"`{result['url']}`",
            f">= {result['minimum']}x",
            _ratio(result["median_ratio"]),
            _ratio(result["worst_ratio"]),
            result["worst_row"] or "-",
            str(result["rows"]),
            "yes" if result["met"] else "**no**",
        ]
        for result in targets
    ]
    header = ["target", "target URL", "needs", "median", "worst", "worst row", "rows", "met"]
    text = _table(header, lines, 2)
    missed = misses(targets)
    if missed:
        text += f"\n\n{missed_intro}\n\n" + "\n".join(f"- {line}" for line in missed)
    return text


def _results_markdown(rows: list[dict[str, Any]]) -> str:
    parts = []
    for url, (mine, baselines) in _by_url(rows).items():
        header = [*_COLUMNS, *(f"vs {b}" for b in baselines)]
        cells = [[cell.replace("|", "\\|") for cell in _cells(row, baselines)] for row in mine]
        parts.append(f"#### `{url}`\n\n" + _table(header, cells, 1))
    return "\n\n".join(parts)


def _concurrency_markdown(points: list[dict[str, Any]]) -> str:
    measured = [row for row in points if "contenders" in row]
    if not measured:
        return "No concurrency sweep in this run (run with `--scaling`)."
    parts = []
    for url, (mine, _) in _by_url(measured).items():
        names = list(dict.fromkeys(name for row in mine for name in row["contenders"]))
        lines = [
            [
                row["operation"],
                str(row["concurrency"]),
                *(
                    f"{row['contenders'][name]['ops_per_second']:,.0f}" if name in row["contenders"] else ""
                    for name in names
                ),
            ]
            for row in sorted(mine, key=lambda row: (row["operation"], row["concurrency"]))
        ]
        parts.append(f"`{url}`, ops/s:\n\n" + _table(["operation", "tasks", *names], lines, 1))
    return "\n\n".join(parts)


def _batching_markdown(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> str:
    parts = []
    for url, (mine, _) in _by_url(rows).items():
        cells = [[cell.replace("|", "\\|") for cell in _batching_cells(row)] for row in mine]
        parts.append(f"#### `{url}`\n\n" + _table(list(_BATCHING_COLUMNS), cells, 1))
    judged = _targets_markdown(targets, "Missed:") if targets else "No target was judged (no row was measured)."
    return "\n\n".join([*parts, judged])


def _e2e_markdown(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> str:
    lines = [[cell.replace("|", "\\|") for cell in _e2e_cells(row)] for row in rows]
    judged = _targets_markdown(targets, "Missed:") if targets else "No target was judged (no row was measured)."
    return "\n\n".join([_table(list(_E2E_COLUMNS), lines, 1), judged])


def _signals_markdown(rows: list[dict[str, Any]], limits: list[dict[str, Any]]) -> str:
    parts = []
    for url, (mine, _) in _by_url(rows).items():
        lines = [[cell.replace("|", "\\|") for cell in line] for row in mine for line in _signals_lines(row)]
        parts.append(f"#### `{url}` ({mine[0].get('replicas')})\n\n" + _table(list(_SIGNALS_COLUMNS), lines, 4))
    parts.append(_limits_markdown(limits) if limits else "No target was judged (no row was measured).")
    return "\n\n".join(parts)


def _limits_markdown(limits: list[dict[str, Any]]) -> str:
    """The judged limits as a markdown table, and the misses."""
    lines = [
        [cell.replace("|", "\\|") for cell in [*_limit_cells(result), "yes" if result["met"] else "**no**"]]
        for result in limits
    ]
    for line in lines:
        line[1] = f"`{line[1]}`"
    judged = _table(["target", "target URL", "needs", "worst", "worst row", "rows", "met"], lines, 2)
    missed = misses(limits)
    if missed:
        judged += "\n\nMissed:\n\n" + "\n".join(f"- {line}" for line in missed)
    return judged


def _tasks_markdown(rows: list[dict[str, Any]], judged: list[dict[str, Any]]) -> str:
    parts = []
    for url, (mine, _) in _by_url(rows).items():
        lines = [[cell.replace("|", "\\|") for cell in line] for row in mine for line in tasks_lines(row)]
        parts.append(f"#### `{url}`\n\n" + _table(list(TASKS_COLUMNS), lines, 3))
    limits = [result for result in judged if "maximum" in result]
    ratios = [result for result in judged if "maximum" not in result]
    if ratios:
        parts.append(_targets_markdown(ratios, "Missed:"))
    if limits:
        parts.append(_limits_markdown(limits))
    if not judged:
        parts.append("No target was judged (no row was measured).")
    return "\n\n".join(parts)


def markdown_sections(document: dict[str, Any]) -> dict[str, str]:
    """BENCHMARKS.md's generated sections that ``document`` fills, by name."""
    signals = _group(document["rows"], SIGNALS_GROUP)
    end_to_end = _group(document["rows"], E2E_GROUP)
    latency, rows = _split(document["rows"])
    tasks_run = any(row["group"] == TASKS_GROUP for row in document["rows"])
    batching_targets = [result for result in document["targets"] if result.get("group") == _BATCHING]
    own = [result for result in document["targets"] if result.get("group") in _OWN_SECTIONS]
    sections = {}
    if rows or not (latency or signals or end_to_end or tasks_run):
        sections = {
            "targets": _targets_markdown([result for result in document["targets"] if result not in own]),
            "results": _results_markdown(rows),
            "concurrency": _concurrency_markdown(document.get("scaling", {}).get("concurrency", [])),
        }
    if latency:
        sections["batching-latency"] = _batching_markdown(latency, batching_targets)
    if signals:
        limits = [result for result in document["targets"] if result.get("group") == SIGNALS_GROUP]
        sections["signals"] = _signals_markdown(signals, limits)
    if end_to_end:
        judged = [result for result in document["targets"] if result.get("group") == E2E_GROUP]
        sections["e2e"] = _e2e_markdown(end_to_end, judged)
    tasks = _group(document["rows"], TASKS_GROUP)
    if tasks:
        judged = [result for result in document["targets"] if result.get("group") == TASKS_GROUP]
        sections["tasks"] = _tasks_markdown(tasks, judged)
    return sections


SECTIONS = ("targets", "results", "concurrency", "batching-latency", "signals", "e2e", "tasks")
"""The names of the generated sections, in page order."""


def update_markdown(path: Path, document: dict[str, Any]) -> None:
    """Rewrite the generated sections of ``path`` that ``document`` fills (a new file holds just those)."""
    sections = markdown_sections(document)
    if not path.exists():
        path.write_text("\n\n".join(_marked(name, sections[name]) for name in SECTIONS if name in sections) + "\n")
        return
    text = path.read_text()
    for name in (name for name in SECTIONS if name in sections):
        pattern = re.compile(rf"<!-- kvstores bench: {name} -->\n.*?<!-- /kvstores bench: {name} -->", re.DOTALL)
        marked = _marked(name, sections[name])
        text, found = pattern.subn(marked.replace("\\", "\\\\"), text)  # the body taken literally
        if not found:
            raise ValueError(f"{path} lacks <!-- kvstores bench: {name} --> ... <!-- /kvstores bench: {name} -->")
    path.write_text(text)


def _marked(name: str, body: str) -> str:
    return f"<!-- kvstores bench: {name} -->\n{body}\n<!-- /kvstores bench: {name} -->"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise missing_extra("matplotlib", "plot") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def _bars(plt: Any, rows: list[dict[str, Any]], path: Path) -> None:
    """ops/s per operation and contender, one panel per target (smallest value, one task)."""
    targets = list(dict.fromkeys(row["target"] for row in rows))
    figure, axes = plt.subplots(len(targets), 1, figsize=(11, 3.6 * len(targets)), squeeze=False)
    for axis, target in zip(axes[:, 0], targets):
        mine = [row for row in rows if row["target"] == target and row["concurrency"] == 1 and "contenders" in row]
        smallest = min((row["value_bytes"] for row in mine if row["value_bytes"]), default=None)
        mine = [row for row in mine if row["value_bytes"] in (smallest, None)]
        names = list(dict.fromkeys(name for row in mine for name in row["contenders"]))
        width = 0.8 / len(names)
        for index, name in enumerate(names):
            points = [
                (i, row["contenders"][name]["ops_per_second"])
                for i, row in enumerate(mine)
                if name in row["contenders"]
            ]
            axis.bar([i + index * width for i, _ in points], [ops for _, ops in points], width, label=name)
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(mine))])
        axis.set_xticklabels([_operation(row) for row in mine], rotation=30, ha="right", fontsize=7)
        axis.set_yscale("log")
        axis.set_ylabel("ops/s (log)")
        axis.set_title(f"{target} — {size_label(smallest)} values, 1 task", fontsize=10)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _lines(plt: Any, rows: list[dict[str, Any]], axis_name: str, metric: str, title: str, path: Path) -> None:
    rows = [row for row in rows if "skipped" not in row]
    figure, axis = plt.subplots(figsize=(8, 5))
    for series in dict.fromkeys((row["target"], row["operation"]) for row in rows):
        points = sorted((row[axis_name], row[metric]) for row in rows if (row["target"], row["operation"]) == series)
        axis.plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"{series[0]} {series[1]}")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel(axis_name.replace("_", " "))
    axis.set_ylabel(metric.replace("_", " "))
    axis.set_title(title, fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _concurrency(plt: Any, rows: list[dict[str, Any]], path: Path) -> None:
    """ops/s against concurrent tasks, one panel per target URL, one line per contender and operation."""
    rows = [row for row in rows if "contenders" in row]
    targets = list(dict.fromkeys(row["target"] for row in rows))
    figure, axes = plt.subplots(len(targets), 1, figsize=(8, 4.2 * len(targets)), squeeze=False)
    for axis, target in zip(axes[:, 0], targets):
        mine = [row for row in rows if row["target"] == target]
        names = dict.fromkeys(name for row in mine for name in row["contenders"])
        for name in names:
            for operation in dict.fromkeys(row["operation"] for row in mine):
                points = sorted(
                    (row["concurrency"], row["contenders"][name]["ops_per_second"])
                    for row in mine
                    if row["operation"] == operation and name in row["contenders"]
                )
                axis.plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"{name} {operation}")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("concurrent tasks")
        axis.set_ylabel("ops/s")
        axis.set_title(f"{target} — throughput against concurrent tasks (100 B values)", fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _sibling(path: Path, name: str) -> Path:
    return path.with_name(f"{path.stem}-{name}{path.suffix}")


def plot(rows: list[dict[str, Any]], scaling: dict[str, list[dict[str, Any]]], path: Path) -> list[Path]:
    """Write the bar chart to ``path`` and, after a scaling run, one chart per sweep beside it.

    The batching-through-latency rows have no chart (their tables say it all).
    """
    plt = _pyplot()
    written = []
    rows = _split(rows)[1]
    if rows:
        _bars(plt, rows, path)
        written.append(path)
    charts = (
        ("collection_size", "keys", "p50_us", "p50 latency against collection size (100 B values, 1 task)"),
        ("value_size", "value_bytes", "p50_us", "p50 latency against value size (1 task)"),
    )
    for key, axis_name, metric, title in charts:
        if scaling.get(key):
            chart = _sibling(path, key.replace("_", "-"))
            _lines(plt, scaling[key], axis_name, metric, title, chart)
            written.append(chart)
    if any("contenders" in row for row in scaling.get("concurrency", [])):
        chart = _sibling(path, "concurrency")
        _concurrency(plt, scaling["concurrency"], chart)
        written.append(chart)
    return written
