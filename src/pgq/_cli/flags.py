"""What a flag's value may be: argparse ``type=`` functions that parse a value and refuse
one that cannot work, saying what a valid one looks like."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable

from pgq._core.names import is_host_name
from pgq.job import MAX_JOB_ID

#: The most rows a listing returns.
MAX_LIST = 100_000


def whole(lowest: int, highest: int) -> Callable[[str], int]:
    """An argument type: a whole number from ``lowest`` to ``highest``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {lowest:,} to {highest:,}, got {text!r}"
            )
        return value

    return parse


job_id = whole(1, MAX_JOB_ID)
port = whole(1, 65535)
health_port = whole(0, 65535)


def host_list(text: str | None) -> list[str] | None:
    """``a.example,b.example`` as a list (None: not given)."""
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def bind_host(text: str) -> str:
    """An argument type: an address to listen on, an IP address (``127.0.0.1``, ``::``) or a
    host name (``localhost``, ``pod.internal``); whether this machine has it shows at bind."""
    name = text.strip()
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
        return name.removeprefix("[").removesuffix("]")
    except ValueError:
        pass
    if is_host_name(name):
        return name
    raise argparse.ArgumentTypeError(
        f"expected an address of this machine (127.0.0.1, or 0.0.0.0 or :: for every "
        f"interface) or a host name, got {text!r}"
    )
