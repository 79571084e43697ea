"""What a command line reports to its user in one line, not a traceback.

Owns: ``UsageError``, the one error type every ``omnix`` verb raises for
something its user must fix (a path that does not exist, a number out of
range, a file that is not what it should be), ``arg_type``, which turns a
checking function into an argparse ``type=`` so the check runs when the
command line is parsed (``int_in``, ``port_number`` and ``count`` are
such types), ``counts`` (a comma list of them, as benches take their
concurrency levels), and ``run_reporting``, which runs a verb and
prints a ``UsageError`` as argparse prints its own errors
(``PROG: error: MESSAGE``) with a non-zero exit status.

The ``omnix`` entry point (``omnix/cli.py``) and the verbs that are also
run as modules (``python -m omnix.stages.worker_cli``) report through it.
It sits on the lowest floor (it imports nothing of omnix) so that a verb on
any floor can raise it.  Does not own any verb, nor which errors are the
user's: each verb turns the errors of its own inputs into a ``UsageError``
where it reads them; a bug still ends in a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

#: argparse's status for a command line that cannot be used
USAGE_EXIT = 2


class UsageError(Exception):
    """Something the user must fix; the message says what was wrong and
    what to do, in one line, naming the input.  ``code`` is the exit
    status (2, as argparse's own errors, unless a verb documents another)."""

    def __init__(self, message: str, code: int = USAGE_EXIT) -> None:
        super().__init__(message)
        self.code = code


def arg_type(check: Callable[[str], _T], name: str = "") -> Callable[[str], _T]:
    """``check`` as an argparse ``type=``: its ``ValueError`` message becomes
    argparse's own error (``PROG: error: argument --FLAG: MESSAGE``), where
    argparse would otherwise say only ``invalid check value``."""

    def convert(text: str) -> _T:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name or check.__name__
    return convert


def int_in(lo: int, hi: int | None = None, what: str = "a number") -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number from ``lo`` (to ``hi``)."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {what}: give a whole number") from None
        if hi is None and value < lo:
            raise ValueError(f"{value} is too small: give {what} of at least {lo}")
        if hi is not None and not lo <= value <= hi:
            raise ValueError(f"{value} is out of range: give {what} from {lo} to {hi}")
        return value

    return arg_type(check, "int")


#: a TCP port, 0 (any free one) included
port_number = int_in(0, 65535, "a port")
#: how many of something: 1 or more
count = int_in(1, what="a count")


def counts(text: str, top: int | None = None, example: str = "1,4,16") -> tuple[int, ...]:
    """A comma list of counts (``1,4,16``): sorted, each once, each 1 or
    more (and at most ``top``); a ``ValueError`` that says what was wrong."""
    try:
        out = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"{text!r} is not a list of counts: give them like {example}") from None
    if not out or out[0] < 1 or (top is not None and out[-1] > top):
        bound = f"from 1 to {top}" if top is not None else "of 1 or more"
        raise ValueError(f"{text!r}: give counts {bound}, like {example}")
    return out


def run_reporting(prog: str, run: Callable[[], int]) -> int:
    """``run()``'s exit status; a ``UsageError`` is printed as
    ``PROG: error: MESSAGE`` on stderr and exits with its ``code``."""
    try:
        return run()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.code
