"""Helpful ImportErrors for optional dependencies."""

from __future__ import annotations


def missing_extra(package: str, extra: str) -> ImportError:
    """An ImportError telling the user which kvstores extra installs ``package``."""
    return ImportError(f'{package} is not installed; install it with: pip install "kvstores[{extra}]"')
