"""The end-of-run checkpoint rule of a formal-language run: which of its last models a run keeps as ``model.pt``.

With a constant learning rate a run can end on a one-check spike (the cpu profile's D_3 seed 0: fit 0.998 / 0.959 /
0.998 at steps 2,800 / 2,900 / 3,000; the last-model rule kept the 0.959 model, which scored 0.781 held out).
``eval.select_last = N`` and ``eval.select_every = M`` make a run of S = ``train.steps`` steps keep, of its models at
steps S − (N − 1)·M, …, S − M, S, the one with the highest *fit*: the mean accuracy over every training length
``data.min_length..data.max_length`` on the fixed evaluation strings (``eval.samples_per_length`` of them per length,
the strings range evaluation draws, so the kept model's fit is the fit the table reports), ties going to the later
step. Lengths past the training range never choose. N = 1 is the last model (the paper's protocol; the default).

Worked example, N = 3, M = 100, S = 3,000: fits 0.998 (2,800), 0.959 (2,900), 0.998 (3,000) → step 3,000 (a tie
with 2,800: the later wins); fits 0.999, 0.959, 0.998 → step 2,800.

A run whose last model fits every training string (fit 1.0) keeps its last model under every N, so a run trained
under the last-model rule with fit 1.0 at its end is the same run under this one (:func:`same_under_rule`).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from regulargpt.config import ConfigError, FormalConfig, FormalEvalConfig
from regulargpt.evaluation.formal_scoring import held_out_score
from regulargpt.tasks import Task

__all__ = ["LAST_MODEL", "KeptModel", "describe_rule", "rule_name", "rule_sets", "same_under_rule"]

LAST_MODEL = "last"  # the rule name of eval.select_last = 1: the model of the last step
_RULE = re.compile(r"best-fit-of-(\d+)-every-(\d+)")


def rule_name(ev: FormalEvalConfig) -> str:
    """``"last"`` for select_last = 1, else ``"best-fit-of-N-every-M"`` (e.g. ``best-fit-of-5-every-100``): the name
    run records and tables carry."""
    return LAST_MODEL if ev.select_last == 1 else f"best-fit-of-{ev.select_last}-every-{ev.select_every}"


def rule_sets(name: str) -> list[str]:
    """The ``--set`` overrides that make a config follow the rule `name` (:func:`rule_name`'s inverse)."""
    if name == LAST_MODEL:
        return ["eval.select_last=1"]
    match = _RULE.fullmatch(name)
    if not match:
        raise ConfigError(f"checkpoint rule {name!r}: expected 'last' or 'best-fit-of-N-every-M'")
    return [f"eval.select_last={match[1]}", f"eval.select_every={match[2]}"]


def describe_rule(name: str) -> str:
    """One line for a table header: ``best-fit-of-5-every-100`` → "the best training-length fit of the last 5
    checks, 100 steps apart (ties: the later)"."""
    if name == LAST_MODEL:
        return "the last model"
    match = _RULE.fullmatch(name)
    if not match:
        return name
    return (f"the best training-length fit of the last {match[1]} checks, {match[2]} steps apart (ties: the later; "
            f"lengths past the training range never choose)")


def same_under_rule(fit: float | None, trained_rule: str, fit_covers_training_lengths: bool) -> bool:
    """Whether a run kept under `trained_rule` is, unchanged, the run another rule would keep: true when it was the
    last model and fit every training string (``fit == 1.0`` over every training length on the evaluation strings,
    which is what the rule's checks measure): no earlier model can fit better, and ties go to the last."""
    return trained_rule == LAST_MODEL and fit == 1.0 and fit_covers_training_lengths


class KeptModel:
    """Tracks the rule's candidates during training: :meth:`observe` after every step checks the fit at the
    window's steps and keeps a copy of the best model so far; :meth:`state` / :meth:`load_state` put it in the
    checkpoint, so a resumed run keeps the same model as an uninterrupted one."""

    def __init__(self, cfg: FormalConfig, task: Task) -> None:
        ev, steps = cfg.eval, cfg.train.steps
        self.rule = rule_name(ev)
        self.steps = {steps - k * ev.select_every for k in range(ev.select_last)}
        self.lengths = range(cfg.data.min_length, cfg.data.max_length + 1)
        self.samples, self.task = ev.samples_per_length, task
        self.checks: list[list[float]] = []  # [step, fit] per check so far
        self.best: dict[str, Any] | None = None  # {"step", "fit", "model": state dict}

    def observe(self, step: int, model: nn.Module) -> None:
        """At a window step: the model's fit (the model only is read; training is unchanged) and, if it is at
        least the best so far, a copy of its weights."""
        if step not in self.steps:
            return
        fit = held_out_score(model, self.task, self.lengths, self.samples)
        self.checks.append([step, fit])
        if self.best is None or fit >= self.best["fit"]:
            self.best = {"step": step, "fit": fit,
                         "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}

    def state(self) -> dict[str, Any]:
        return {"rule": self.rule, "checks": self.checks, "best": self.best}

    def load_state(self, state: dict[str, Any] | None, where: str) -> None:
        if state is None:
            return
        if state["rule"] != self.rule:
            raise ConfigError(f"{where}: the checkpoint tracked the rule {state['rule']!r}, the config says "
                              f"{self.rule!r}")
        self.checks, self.best = state["checks"], state["best"]

    def keep(self, model: nn.Module) -> dict[str, Any]:
        """Load the kept weights into `model` → model.pt's meta entries: ``kept_step`` and ``selection`` (rule and
        every check's [step, fit])."""
        if self.best is None:
            raise ConfigError(f"checkpoint rule {self.rule}: no check was made (window steps {sorted(self.steps)})")
        with torch.no_grad():
            model.load_state_dict(self.best["model"])
        return {"kept_step": self.best["step"], "selection": {"rule": self.rule, "checks": self.checks}}
