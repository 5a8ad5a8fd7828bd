"""The shared wrapper of every command-line entry point: user errors become one line and exit status 2.

    if __name__ == "__main__":
        run(main)          # main() -> int | None

A :class:`~regulargpt.errors.UserError` (ConfigError, DataError, CheckpointError, TrainError, TaskError) prints
``error: <message>`` on stderr — no traceback — and exits with status 2; in a multi-process run (RANK set) ranks other
than 0 prefix the line with their rank, so an error only one rank sees is still reported. Any other exception is a bug
and propagates with its traceback; Ctrl-C that reaches ``main`` prints ``interrupted`` and exits 130. ``main``'s return
value is the exit status (None means 0).

The argparse ``type=`` functions below validate a flag's value when it is parsed, so a bad one fails like any
argparse error, naming the flag, with exit status 2::

    p.add_argument("--steps", type=positive_int)     # --steps 0 → error: argument --steps: '0': expected an integer >= 1
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from regulargpt.errors import UserError

__all__ = [
    "USAGE_ERROR",
    "INTERRUPTED",
    "report",
    "run",
    "positive_int",
    "non_negative_int",
    "positive_float",
    "non_negative_float",
    "fraction",
    "positive_ints",
]

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


# ------------------------------------------------------------------------------------- argparse value types


def _number(text: str, kind: type, ok: Callable[[float], bool], expected: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1, e.g. ``--steps 1000``."""
    return _number(text, int, lambda v: v >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0, e.g. ``--seed 0`` or a count where 0 means "the default"."""
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0, e.g. ``--lr 3e-4``."""
    return _number(text, float, lambda v: v > 0, "a finite number > 0")


def non_negative_float(text: str) -> float:
    """A finite number >= 0, e.g. ``--hours 0`` (0 = no limit)."""
    return _number(text, float, lambda v: v >= 0, "a finite number >= 0")


def fraction(text: str) -> float:
    """A number in [0, 1], e.g. ``--top-p 0.95``."""
    return _number(text, float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers >= 1, sorted and without repeats, e.g. ``--lengths 512,1024,2048``."""
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 512,1024,2048") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers >= 1")
    return sorted(set(values))


ROPE_SCALING_HELP = ('RoPE scaling at inference, a Hugging Face rope_scaling JSON object: rope_type linear, ntk, '
                     'dynamic or yarn, factor >= 1, original_max_position_embeddings (the training length; dynamic '
                     'and yarn need it), e.g. --rope-scaling \'{"rope_type": "yarn", "factor": 4, '
                     '"original_max_position_embeddings": 512}\' (docs/EVALUATION.md)')


def rope_scaling_json(text: str) -> dict[str, Any]:
    """A checked ``rope_scaling`` object (:func:`regulargpt.config.rope_scaling.check_rope_scaling`), e.g.
    ``--rope-scaling '{"rope_type": "linear", "factor": 4}'``."""
    import json

    from regulargpt.config.rope_scaling import RopeScalingError, check_rope_scaling

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: not JSON ({err.msg}); expected e.g. "
                                         f'\'{{"rope_type": "linear", "factor": 4}}\'') from None
    try:
        scaling = check_rope_scaling(raw, "--rope-scaling")
    except RopeScalingError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not scaling:
        raise argparse.ArgumentTypeError(f"{text!r}: an empty scaling; leave --rope-scaling out for none")
    return scaling
