"""The shared wrapper of every command-line entry point: user errors become one line and exit status 2.

    if __name__ == "__main__":
        run(main)          # main() -> int | None

A :class:`~regulargpt.errors.UserError` (ConfigError, DataError, CheckpointError, TrainError, TaskError) prints
``error: <message>`` on stderr — no traceback — and exits with status 2; in a multi-process run (RANK set) ranks other
than 0 prefix the line with their rank, so an error only one rank sees is still reported. Any other exception is a bug
and propagates with its traceback; Ctrl-C that reaches ``main`` prints ``interrupted`` and exits 130. ``main``'s return
value is the exit status (None means 0).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

from regulargpt.errors import UserError

__all__ = ["USAGE_ERROR", "INTERRUPTED", "report", "run"]

USAGE_ERROR = 2  # exit status of a user error, as argparse uses for bad flags
INTERRUPTED = 130  # Ctrl-C, as a shell reports a process ended by SIGINT (128 + 2)


def report(err: BaseException) -> None:
    """Print `err` as the one line ``error: <message>`` (``error (rank N): …`` on ranks other than 0)."""
    rank = os.environ.get("RANK", "0")
    where = "" if rank == "0" else f" (rank {rank})"
    message = " ".join(str(err).split("\n"))  # one line, whatever the message holds
    print(f"error{where}: {message}", file=sys.stderr, flush=True)


def run(main: Callable[[], int | None]) -> NoReturn:
    """Call ``main()`` and exit with its status; a UserError exits 2 after printing its one-line message."""
    try:
        status = main()
    except UserError as err:
        report(err)
        sys.exit(USAGE_ERROR)
    except KeyboardInterrupt:  # Ctrl-C where no handler of the command's own catches it (e.g. during start-up)
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED)
    sys.exit(status or 0)
