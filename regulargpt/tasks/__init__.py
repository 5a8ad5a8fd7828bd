"""The regular-language task suite: `make_task(name, **options)` and `TASK_NAMES`.

Token ids and labels are listed in docs/FORMAL.md (the task table); each task's docstring gives its definition, a worked example and
how it samples. Options: parity_check `p_one`; modular_arithmetic `modulus`, `leading_plus`; dyck `n` (required).
"""
import difflib
import inspect
from collections.abc import Callable
from functools import partial

from regulargpt.errors import UserError
from regulargpt.tasks.base import DfaMembershipTask, Task
from regulargpt.tasks.counting import StarTask
from regulargpt.tasks.cycle_navigation import CycleNavigation
from regulargpt.tasks.dyck import DyckTask
from regulargpt.tasks.even_pairs import EvenPairs
from regulargpt.tasks.modular_arithmetic import ModularArithmetic
from regulargpt.tasks.parity_check import ParityCheck
from regulargpt.tasks.tomita import TomitaTask

_REGISTRY: dict[str, Callable[..., Task]] = {
    "even_pairs": EvenPairs,
    "parity_check": ParityCheck,
    "cycle_navigation": CycleNavigation,
    "modular_arithmetic": ModularArithmetic,
    **{f"tomita_{k}": partial(TomitaTask, k) for k in (1, 3, 4, 5, 6, 7)},
    "dyck": DyckTask,
    **{name: partial(StarTask, name) for name in ("aa_star", "aaaa_star", "abab_star")},
}
TASK_NAMES: tuple[str, ...] = tuple(_REGISTRY)


class TaskError(UserError, ValueError):
    """An unknown task name or option, a missing required option, or an option value out of range."""


def make_task(name: str, **options: int | float | bool) -> Task:
    """Builds the task `name`, e.g. `make_task("dyck", n=2)`; bad names, options or values raise TaskError."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, TASK_NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise TaskError(f"Unknown task {name!r}.{hint} Allowed: {', '.join(TASK_NAMES)}.")
    factory = _REGISTRY[name]
    params = inspect.signature(factory).parameters
    allowed = ", ".join(params) or "none"
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise TaskError(f"Unknown option(s) {', '.join(unknown)} for task {name!r}. Allowed options: {allowed}.")
    missing = [p for p, spec in params.items() if spec.default is inspect.Parameter.empty and p not in options]
    if missing:
        raise TaskError(f"Task {name!r} requires option(s) {', '.join(missing)}.")
    try:
        return factory(**options)
    except ValueError as err:  # an option value out of range, e.g. dyck n=0 or parity_check p_one=1.5
        raise TaskError(str(err)) from None


__all__ = ["TASK_NAMES", "DfaMembershipTask", "Task", "TaskError", "make_task"]
