"""The supported Pythons: pyproject's classifiers, the versions .ci/run runs and the README's table agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_classifiers_name_exactly_the_pythons_ci_runs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classified = [
        classifier.rsplit(" :: ", 1)[1]
        for classifier in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", classifier)
    ]
    ci = re.findall(r'^py\d+="\$\(python_for (3\.\d+)\)"$', (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert classified == ci, "pyproject's classifiers and the Pythons .ci/run installs differ"
    assert project["requires-python"] == f">={classified[0]}"
    readme = (ROOT / "README.md").read_text()
    compatibility = readme[readme.index("## Compatibility") :]
    header = next(line for line in compatibility.splitlines() if line.startswith("| | Python"))
    assert header == "| | " + " | ".join(f"Python {version}" for version in classified) + " |"
