"""Stopping a training run: signals (:class:`StopRequest`) and the end of the launcher (:class:`Lifeline`).

A stop request — SIGTERM, SIGUSR1 (SLURM, 120 s before the time limit), SIGINT (Ctrl-C), or the launcher gone —
makes every rank finish its step and checkpoint at the same step (the loop all-reduces the flags), then exit 0.

``kill -TERM <pid of the deepspeed command>`` ends DeepSpeed's runner silently; its per-node
``deepspeed.launcher.launch`` and the ranks under it are re-parented and would train on with nobody to stop them.
Likewise a torchrun agent killed with SIGKILL leaves its ranks behind. At start-up :class:`Lifeline` records the chain
of launcher processes above this rank — its parent when that is a launcher, then the parent's parent while that is
one too (rank → ``deepspeed.launcher.launch`` → the ``deepspeed`` runner; rank → ``torchrun``) — and a daemon thread
checks every `interval` seconds that each is still alive (same pid and start time, not a zombie). When one is gone
it calls ``on_gone(reason)`` once; the trainer treats that as a stop request, so every rank checkpoints at the same
step (the stop flag is all-reduced) and exits 0. A process not started by a launcher (plain ``python
launch/pretrain.py``, even under nohup or a shell that exits) watches nothing. A rank whose launcher ended while it
was still starting (:func:`orphaned`) is stopped before it trains or writes anything.

    lifeline = Lifeline(lambda reason: print(reason))
    lifeline.start()          # → the watched processes, e.g. [torchrun (pid 812)]
    ...
    lifeline.stop()

Launchers are recognised by their command line: an argument among the first four named ``torchrun`` or
``deepspeed`` (the console scripts), or the module names ``torch.distributed.run``, ``torch.distributed.launch``,
``deepspeed.launcher.launch``, ``deepspeed.launcher.runner``. :func:`launch_command` is the command a user ran (the
top launcher's, or this process's own), for the "resume with" line.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["StopRequest", "LAUNCHERS", "launcher_chain", "orphaned", "launch_command", "Lifeline"]

class StopRequest:
    """SIGTERM, SIGUSR1, SIGINT (Ctrl-C) or :meth:`request` (the launcher is gone) → ``requested``, with a
    ``reason``; a signal more than `grace_s` after the first request ends the process at once (status 128 + signal)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, grace_s: float = 2.0) -> None:
        self.requested, self.first_at, self.grace_s, self.signum, self.reason = False, 0.0, grace_s, 0, ""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def by_signal(self) -> bool:
        return self.signum != 0

    def request(self, reason: str) -> None:
        """Ask for a stop (from any thread); a later request or signal within `grace_s` is the same request."""
        if not self.requested:
            self.requested, self.first_at, self.reason = True, time.monotonic(), reason

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and time.monotonic() - self.first_at > self.grace_s:
            os._exit(128 + signum)
        if not self.requested:
            self.signum = signum
            self.request(f"signal {signal.Signals(signum).name}")


LAUNCHERS = {"torchrun", "deepspeed", "torch.distributed.run", "torch.distributed.launch",
             "deepspeed.launcher.launch", "deepspeed.launcher.runner"}


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.Error, OSError):
        return []


def _is_launcher(proc: psutil.Process) -> bool:
    return any(arg in LAUNCHERS or Path(arg).name in LAUNCHERS for arg in _cmdline(proc)[:4])


def launcher_chain(pid: int | None = None) -> list[psutil.Process]:
    """The launcher processes above `pid` (default: this process), nearest first; [] when its parent is none."""
    chain: list[psutil.Process] = []
    try:
        proc = psutil.Process(pid or os.getpid()).parent()
        while proc is not None and _is_launcher(proc):
            chain.append(proc)
            proc = proc.parent()
    except psutil.Error:
        pass
    return chain


def orphaned(parent_at_start: int | None) -> bool:
    """True when a launcher started this process (torchrun and DeepSpeed's launch set TORCHELASTIC_RUN_ID and
    CROSS_RANK in their ranks' environment) and the parent it had at start-up (`parent_at_start`, recorded before
    the slow imports) has ended since: a launcher killed while its ranks were still starting."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ or "CROSS_RANK" in os.environ
    return parent_at_start is not None and launched and os.getppid() != parent_at_start


def launch_command(chain: list[psutil.Process]) -> str:
    """The command that started this run, e.g. ``deepspeed --num_gpus 2 launch/pretrain.py --config …``: the top
    launcher's command line (without its python interpreter), or this process's own (``python launch/pretrain.py …``,
    with this interpreter's full path when ``python`` on PATH is another one, so the command works as printed);
    DeepSpeed's ``--local_rank`` argument is left out."""
    words = _cmdline(chain[-1]) if chain else [_python(), *sys.argv]
    if len(words) > 1 and Path(words[1]).name in LAUNCHERS:
        words = [Path(words[1]).name, *words[2:]]  # "/venv/bin/python /venv/bin/deepspeed …" → "deepspeed …"
    return shlex.join(w for w in words if not w.startswith("--local_rank"))


def _python() -> str:
    """"python" when that name on PATH runs this interpreter, else this interpreter's path."""
    found = shutil.which("python")
    return "python" if found and Path(found).resolve() == Path(sys.executable).resolve() else sys.executable


def _label(proc: psutil.Process) -> str:
    """e.g. 'deepspeed (pid 812)'."""
    words = _cmdline(proc)[:4]
    name = next((Path(w).name for w in words if w in LAUNCHERS or Path(w).name in LAUNCHERS), "launcher")
    return f"{name} (pid {proc.pid})"


class Lifeline:
    """A daemon thread that calls ``on_gone(reason)`` once, when a launcher above this process has ended."""

    def __init__(self, on_gone: Callable[[str], None], interval: float = 0.5) -> None:
        self.on_gone, self.interval = on_gone, interval
        self.watched: list[psutil.Process] = []
        self._labels: list[str] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> list[psutil.Process]:
        self.watched = launcher_chain()
        self._labels = [_label(proc) for proc in self.watched]  # while their command lines can still be read
        if self.watched:
            self._thread = threading.Thread(target=self._watch, name="regulargpt-lifeline", daemon=True)
            self._thread.start()
        return self.watched

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _gone(self, proc: psutil.Process) -> bool:
        try:
            return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def _watch(self) -> None:
        while not self._done.wait(self.interval):
            for proc, label in zip(self.watched, self._labels):
                if self._gone(proc):
                    self.on_gone(f"launcher {label} is gone")
                    return
