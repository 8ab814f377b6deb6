"""Reporting: the targets, the tables, the JSON document and the plots."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstores._optional import missing_extra
from kvstores.bench._scenarios import KV_OPERATIONS, SINGLE_OPERATIONS

__all__ = ["TARGETS", "Target", "evaluate", "plot", "print_tables"]


@dataclass(frozen=True)
class Target:
    """A ratio kvstores promises: median of ours/baseline ops/s over the matching rows >= ``minimum``."""

    label: str
    backend: str | None
    """Backend family the rows come from; None: each backend with matching rows separately."""
    operations: tuple[str, ...]
    """Operations (for events: the suffix after the event store's name) the target covers."""
    baseline: str
    minimum: float
    value_bytes: int | None = None
    """Only rows of this value size (None: every size)."""

    def matches(self, row: dict[str, Any]) -> bool:
        """True if ``row`` counts towards this target."""
        operation = str(row["operation"]).rpartition(".")[2]
        return (
            (self.backend is None or row["backend"] == self.backend)
            and operation in self.operations
            and (self.value_bytes is None or row["value_bytes"] == self.value_bytes)
            and self.baseline in row.get("ratios", {})
        )


TARGETS = (
    Target("MemoryStore vs py-key-value MemoryStore, 100 B", "memory", KV_OPERATIONS, "py-key-value", 10.0, 100),
    Target("MemoryStore vs py-key-value MemoryStore, all sizes", "memory", KV_OPERATIONS, "py-key-value", 10.0),
    Target("MemoryStore vs dict+json (within 2x)", "memory", KV_OPERATIONS, "dict+json", 0.5),
    Target("SQLiteStore get vs raw aiosqlite", "sqlite", ("get",), "aiosqlite", 0.8),
    Target("RedisStore single-key ops vs raw redis.asyncio", "redis", SINGLE_OPERATIONS, "redis.asyncio", 0.9),
    Target("RedisStore single-key ops vs py-key-value RedisStore", "redis", SINGLE_OPERATIONS, "py-key-value", 1.3),
    Target("MongoDBStore vs raw pymongo", "mongodb", KV_OPERATIONS, "pymongo", 0.85),
    Target("event store append vs fastmcp EventStore", None, ("append",), "fastmcp", 3.0),
    Target("event store replay vs fastmcp EventStore", None, ("replay",), "fastmcp", 5.0),
)
"""The ratios the issue asks for (kvstores issue 7 and the event-store issue)."""


def evaluate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target measured in ``rows``: median and worst ratio, and whether the median meets it."""
    results = []
    for target in TARGETS:
        matching = [row for row in rows if target.matches(row)]
        for backend in sorted({row["backend"] for row in matching}):
            ratios = [row["ratios"][target.baseline] for row in matching if row["backend"] == backend]
            median = statistics.median(ratios)
            results.append(
                {
                    "target": target.label if target.backend else f"{target.label} ({backend})",
                    "baseline": target.baseline,
                    "minimum": target.minimum,
                    "median_ratio": round(median, 3),
                    "worst_ratio": round(min(ratios), 3),
                    "rows": len(ratios),
                    "met": median >= target.minimum,
                }
            )
    return results


def _size(value_bytes: int | None) -> str:
    if value_bytes is None:
        return "-"
    for unit, scale in (("MB", 1_000_000), ("KB", 1_000)):
        if value_bytes >= scale:
            return f"{value_bytes / scale:g} {unit}"
    return f"{value_bytes} B"


def _console() -> Any:
    try:
        from rich.console import Console
    except ImportError as exc:
        raise missing_extra("rich", "cli") from exc
    console = Console()
    return console if console.is_terminal else Console(width=160)


def print_tables(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> None:
    """Print one table per target URL (ours, then each baseline's ratio), then the targets."""
    from rich.table import Table

    console = _console()
    for target in dict.fromkeys(row["target"] for row in rows):
        mine = [row for row in rows if row["target"] == target]
        baselines = list(dict.fromkeys(name for row in mine for name in row.get("ratios", {})))
        table = Table(title=f"kvstores bench {target}", title_justify="left")
        for column in ("operation", "value", "tasks", "ops/s", "p50 µs", "p99 µs", *(f"vs {b}" for b in baselines)):
            table.add_column(column, justify="left" if column == "operation" else "right")
        for row in mine:
            if "skipped" in row:
                table.add_row(
                    row["operation"], _size(row["value_bytes"]), str(row["concurrency"]), "skipped", row["skipped"]
                )
                continue
            ours = row["contenders"]["kvstores"]
            ratios = [f"{row['ratios'][b]:.2f}x" if b in row["ratios"] else "" for b in baselines]
            table.add_row(
                row["operation"],
                _size(row["value_bytes"]),
                str(row["concurrency"]),
                f"{ours['ops_per_second']:,.0f}",
                f"{ours['p50_us']:,.1f}",
                f"{ours['p99_us']:,.1f}",
                *ratios,
            )
        console.print(table)
    if targets:
        table = Table(title="targets (ratio = kvstores ops/s / baseline ops/s; median over rows)", title_justify="left")
        for column in ("target", "needs", "median", "worst", "rows", "met"):
            table.add_column(column, justify="left" if column == "target" else "right")
        for result in targets:
            table.add_row(
                result["target"],
                f">= {result['minimum']}x",
                f"{result['median_ratio']:.2f}x",
                f"{result['worst_ratio']:.2f}x",
                str(result["rows"]),
                "yes" if result["met"] else "[bold red]NO[/]",
            )
        console.print(table)


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
        axis.set_xticklabels([row["operation"] for row in mine], rotation=20, ha="right", fontsize=8)
        axis.set_yscale("log")
        axis.set_ylabel("ops/s (log)")
        axis.set_title(f"{target} — {_size(smallest)} values, 1 task", fontsize=10)
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


def plot(rows: list[dict[str, Any]], scaling: dict[str, list[dict[str, Any]]], path: Path) -> list[Path]:
    """Write the bar chart to ``path`` and, after a scaling run, one line chart per axis beside it."""
    plt = _pyplot()
    written = [path]
    _bars(plt, rows, path)
    charts = (
        ("collection_size", "keys", "p50_us", "p50 latency against collection size (100 B values, 1 task)"),
        ("value_size", "value_bytes", "p50_us", "p50 latency against value size (1 task)"),
        ("concurrency", "concurrency", "ops_per_second", "throughput against concurrent tasks (100 B values)"),
    )
    for key, axis_name, metric, title in charts:
        if scaling.get(key):
            chart = path.with_name(f"{path.stem}-{key.replace('_', '-')}{path.suffix}")
            _lines(plt, scaling[key], axis_name, metric, title, chart)
            written.append(chart)
    return written
