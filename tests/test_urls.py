"""A password that a URL parser would cut is refused before any driver reads it, naming none of it.

``redis://app:Mm4q/Hh8@host`` ends its host part at the ``/`` for every URL parser: the driver
would read ``Mm4q`` as a port and say so ("Port could not be cast to integer value as 'Mm4q'"),
and that part of the password would reach errors, telemetry and the CLI's stderr.
"""

from __future__ import annotations

import itertools
import logging

import pytest

from kvstores import open_store
from kvstores._urls import check_user_info
from kvstores.cli import main
from kvstores.registry import SCHEMES

PARTS = ("Mm4q", "Hh8x")
"""The password's two halves: neither may appear in any output."""

_WITH_AUTHORITY = sorted(scheme for scheme in SCHEMES if scheme not in ("memory", "sqlite", "unix"))


def _url(scheme: str, delimiter: str) -> str:
    return f"{scheme}://app:{PARTS[0]}{delimiter}{PARTS[1]}@127.0.0.1:1/db"


@pytest.mark.parametrize(("scheme", "delimiter"), list(itertools.product(_WITH_AUTHORITY, "/?#")))
def test_a_cut_password_is_refused_at_open_without_a_trace_of_it(
    scheme: str, delimiter: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url = _url(scheme, delimiter)
    with pytest.raises(ValueError, match="percent-encode") as raised:
        open_store(url)
    caplog.set_level(logging.DEBUG)
    assert main(["ping", url]) != 0
    output = capsys.readouterr()
    for text in (str(raised.value), repr(raised.value), output.out, output.err, caplog.text):
        assert not any(part in text for part in PARTS), text
    assert "percent-encode" in output.err


@pytest.mark.parametrize(
    "url",
    [
        "redis://host:6379/0?client_name=a@b",  # an "@" in the query, after a host and port
        "redis://host/0?client_name=a@b",
        "redis://app:a@b@host/0",  # an unescaped "@" alone: every parser splits at the last one
        "postgresql://u:a:b@[::1]:5432/db",
        "mongodb://u:Mm4q%2FHh8x@h1,h2/db?replicaSet=rs",
        "unix://:pw@/run/redis.sock?db=1",
        "sqlite:///dir/a@b.db",
    ],
)
def test_urls_every_parser_reads_alike_are_accepted(url: str) -> None:
    check_user_info(url)
