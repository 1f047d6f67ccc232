"""argparse's parser, with usage errors that never show a password: argparse quotes what it
cannot parse (``invalid choice: 'postgresql://u:secret@db/app'``), so every message is
scrubbed of the password of every argument shaped like a DSN, and of ``--auth``'s."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pgq._core.dsn import scrub_arguments

#: Options whose whole value after the first ':' is a password (USER:PASSWORD).
_PASSWORD_FLAGS = ("--auth",)


class _Usage(Exception):
    """A subcommand's usage error, carried up to the parser that knows every argument."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class SubParser(argparse.ArgumentParser):
    """A command's parser: its usage errors go up to :class:`Parser`, which masks them."""

    def error(self, message: str) -> NoReturn:
        raise _Usage(self, message)


class Parser(argparse.ArgumentParser):
    """The top-level parser: a usage error, its own or a command's, is printed with every
    argument's password masked, then exits with status 2 as argparse does."""

    _argv: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = list(sys.argv[1:] if args is None else args)
        try:
            return super().parse_known_args(self._argv, namespace)
        except _Usage as usage:
            self._fail(usage.parser, usage.message)

    def error(self, message: str) -> NoReturn:
        self._fail(self, message)

    def _fail(self, parser: argparse.ArgumentParser, message: str) -> NoReturn:
        masked = scrub_arguments(message, self._argv)
        for i, arg in enumerate(self._argv):
            flag, eq, value = arg.partition("=")
            if flag in _PASSWORD_FLAGS:
                if not eq:
                    value = self._argv[i + 1] if i + 1 < len(self._argv) else ""
                password = value.partition(":")[2]
                if password:
                    masked = masked.replace(password, "***")
        parser.print_usage(sys.stderr)
        parser.exit(2, f"{parser.prog}: error: {masked}\n")
