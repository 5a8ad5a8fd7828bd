"""Retrain one recorded formal run from its run record and compare the result with the record.

``python eval/formal.py reproduce --task T --model M --seed S`` finds the record ``T/M/seed<S>_lr<LR>`` in
``results/formal/table1_<profile>.json`` (:mod:`~regulargpt.experiments.formal_records`), plans the same grid point
from the profile as the sweep does, with the record's checkpoint rule (``eval.select_last`` / ``select_every``,
:func:`~regulargpt.train.formal_selection.rule_sets`), and refuses when the planned recipe is not the record's (the
configs have changed since: check out the commit that trained it). It then trains and range-evaluates the run in a
fresh folder, exactly as the sweep does (one process, ``--threads`` torch threads; the sweep used 1), and compares
score, fit, kept step and Table 2 scores with the record.

Training is deterministic on one machine: with the code commit that trained the record, every number must be
identical (bit for bit); a difference there is a failure (exit status 1). With other code, a difference is
reported with both commits (exit status 0): a change that is equal in exact arithmetic can still move a run
(21f8a76 moved Even Pairs seed 0 from 0.980 to 0.999, docs/FORMAL.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from regulargpt.config import ConfigError
from regulargpt.experiments.formal_records import RunRecord, read_records
from regulargpt.experiments.formal_sweep import Profile, RunSpec, execute_run, plan_runs
from regulargpt.experiments.formal_tables import collect_runs
from regulargpt.provenance import git_commit
from regulargpt.train.formal_selection import rule_sets

__all__ = ["Reproduction", "find_record", "plan_reproduction", "reproduce"]


def find_record(table: str | Path, task: str, model: str, seed: int, lr: float | None = None) -> RunRecord:
    """The record of `task`/`model`/seed `seed` (and `lr`, needed when the table holds several) in `table`; a
    ConfigError naming what the table holds when there is none or more than one."""
    records = read_records(table)
    mine = [r for r in records if (r.task_id, r.model, r.seed) == (task, model, seed) and (lr is None or r.lr == lr)]
    if len(mine) == 1:
        return mine[0]
    if mine:
        raise ConfigError(f"{table}: {task}/{model} seed {seed} is recorded at several learning rates "
                          f"({', '.join(f'{r.lr:g}' for r in mine)}); pass --lr")
    cell = sorted(f"seed {r.seed} lr {r.lr:g}" for r in records if (r.task_id, r.model) == (task, model))
    raise ConfigError(f"{table}: no record of {task}/{model} seed {seed}" + (f" lr {lr:g}" if lr is not None else "")
                      + (f"; it records {', '.join(cell)}" if cell else f"; its cells: see {Path(table).name}"))


def plan_reproduction(profile: Profile, record: RunRecord, out_dir: str | Path,
                      configs_dir: str | Path = "configs/formal") -> RunSpec:
    """The sweep's grid point of `record` under `profile`, kept by the record's rule; a ConfigError when the
    profile's configs no longer give the record's recipe."""
    spec, = plan_runs(profile, out_dir, configs_dir=configs_dir, tasks=[record.task_id], models=[record.model],
                      seeds=[record.seed], lrs=[record.lr], sets=rule_sets(record.rule))
    if spec.recipe != record.recipe:
        raise ConfigError(f"{record.name}: the profile {profile.name!r} now plans recipe {spec.recipe} for it, the "
                          f"record was trained with {record.recipe}: the configs changed since; reproduce it from "
                          f"the commit that trained it ({record.trained_at or 'not recorded'}, e.g. in a git "
                          f"worktree)")
    return spec


@dataclass(frozen=True)
class Reproduction:
    """A record and its retrained run, with the code commits of both."""

    recorded: RunRecord
    now: RunRecord
    commit: str  # the code that retrained it

    @property
    def differences(self) -> list[str]:
        """One line per number that differs: ``score: 0.980078 → 0.999219 (+0.019141)``."""
        pairs = [("score", self.recorded.score, self.now.score), ("fit", self.recorded.fit, self.now.fit),
                 ("kept step", self.recorded.kept_step, self.now.kept_step)]
        pairs += [(f"Table 2 P(1)={p} {part}", old[i], self.now.table2.get(p, [None, None])[i])
                  for p, old in sorted(self.recorded.table2.items())
                  for i, part in enumerate(("training lengths", "score lengths"))]
        return [f"{name}: {_num(a)} → {_num(b)}" + (f" ({b - a:+.6f})" if _numbers(a, b) else "")
                for name, a, b in pairs if a != b]

    @property
    def same_code(self) -> bool:
        return self.recorded.trained_at is not None and self.recorded.trained_at == self.commit

    def report(self) -> list[str]:
        r = self.recorded
        lines = [f"reproduce {r.name} (rule {r.rule}, recipe {r.recipe}, {r.steps:,} steps)",
                 f"  recorded: score {r.score:.6f}, fit {_num(r.fit)}; trained by the code at "
                 f"{r.trained_at or 'not recorded'}",
                 f"  now:      score {self.now.score:.6f}, fit {_num(self.now.fit)}; trained by the code at "
                 f"{self.commit}"]
        if not self.differences:
            return [*lines, "  identical: every recorded number is reproduced"]
        verdict = ("NOT reproduced with the same code commit" if self.same_code else
                   f"differs; the code differs (recorded {r.trained_at or 'not recorded'}, now {self.commit})")
        return [*lines, f"  {verdict}:", *(f"    {d}" for d in self.differences)]


def _numbers(a: object, b: object) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float))


def _num(value: object) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.6f}"
    return str(value)


def reproduce(spec: RunSpec, record: RunRecord) -> Reproduction:
    """Train and evaluate `spec` (the record's grid point, :func:`plan_reproduction`) in its fresh run folder and
    read it back as a record. A folder that already exists is an error: the run would not be trained again."""
    if spec.run_dir.exists():
        raise ConfigError(f"{spec.run_dir}: exists; reproduce trains into a fresh folder (another --out, or delete it)")
    result = execute_run(spec)
    if result["error"]:
        raise ConfigError(f"{spec.name}: retraining failed: {result['error']} (traceback in "
                          f"{spec.run_dir / 'error.txt'})")
    runs_dir = spec.run_dir.parents[2]
    found = [run for run in collect_runs(runs_dir, spec.profile)[0]
             if (run.task_id, run.model, run.seed, run.lr) == (spec.task_id, spec.model, spec.seed, spec.lr)]
    commit = git_commit()
    return Reproduction(recorded=record, now=found[0].record(commit), commit=found[0].meta.get("code_commit", commit))
