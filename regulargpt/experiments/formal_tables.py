"""Table 1 and Table 2 of the paper from finished sweep runs: scores read from the range-evaluation files.

Table 1: rows = tasks, columns = models, cell = max / mean over seeds × learning rates of the run score (mean
accuracy over the evaluated lengths ``eval.score_min_length..eval.max_length``, i.e. 41..500), like the paper.
Table 2: the Table 2 task (Parity, trained at P(1) = 0.5) evaluated at other P(1): rows = models, columns = P(1),
once over the training lengths (``data.min_length..data.max_length``, 1..40) and once over 41..max; cells as above.

Each Table 1 cell also carries the runs' *fit*: the mean accuracy over the evaluated training lengths
(``data.min_length..data.max_length``). A run whose fit is below :data:`FIT_THRESHOLD` did not learn the task on
the lengths it was trained on, so its low score is a failure to learn, not to extrapolate; such cells are marked †
and a fit table follows each section (Deletang et al. make the same distinction).

Every report starts with the command, git commit, machine, date, and the exact length ranges and sample counts,
all read from the runs; no number is typed by hand. Only runs of the requested profile whose ``model.pt`` and
evaluation files are complete count; the others are listed as pending. The tables are computed from one
:class:`~regulargpt.experiments.formal_records.RunRecord` per run, kept in the table's JSON, so a later aggregation
carries runs whose folders are gone (``keep``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.config import ConfigError, FormalConfig, formal_config_from_saved
from regulargpt.evaluation.formal_scoring import RangeEvalError, range_score, read_rows
from regulargpt.experiments.formal_records import (
    OTHER_RULE,
    STALE,
    RunRecord,
    dump_records,
    eval_lengths_text,
    read_records,
    standings,
)
from regulargpt.experiments.formal_table_text import (
    FIT_THRESHOLD,
    STALE_NOTE,
    cell_text,
    fit_text,
    header_lines,
    marks,
    protocol_lines,
    rule_lines,
)
from regulargpt.experiments.formal_sweep import STALE_MARK, Profile, RunSpec, recipe_id
from regulargpt.experiments.table_changes import describe_changes, read_table, same_apart_from_provenance
from regulargpt.files import atomic_write_text, read_json_object
from regulargpt.provenance import provenance
from regulargpt.run_directory import saved_config
from regulargpt.run_directory.layout import CONFIG_FILE, MODEL_FILE, RANGE_FILE, SWEEP_FILE
from regulargpt.train.formal_selection import rule_name

__all__ = ["FIT_THRESHOLD", "FinishedRun", "collect_runs", "table1", "table2", "write_tables"]



@dataclass
class FinishedRun:
    task_id: str
    model: str
    seed: int
    lr: float
    cfg: FormalConfig
    eval_lengths: list[int]
    samples: int
    evals: dict[float | None, dict[int, dict[str, float]]]  # P(1) (None = training options) -> rows by length
    meta: dict[str, Any]  # from model.pt: step, train_seconds, ...
    parameters: int

    @property
    def recipe(self) -> str:
        return recipe_id(self.cfg)

    @property
    def score(self) -> float:
        return range_score(self.evals[None], self.cfg.eval.score_min_length, self.cfg.eval.max_length)

    @property
    def fit(self) -> float | None:
        """Mean accuracy over the evaluated training lengths (data.min_length..data.max_length); None when the
        run's evaluation holds none of them."""
        try:
            return range_score(self.evals[None], self.cfg.data.min_length, self.cfg.data.max_length)
        except RangeEvalError:
            return None

    def record(self, commit: str) -> RunRecord:
        """What the tables need from this run (:class:`RunRecord`), first read from its folder at `commit`."""
        data, ev = self.cfg.data, self.cfg.eval
        scored = [t for t in self.eval_lengths if ev.score_min_length <= t <= ev.max_length]
        protocol = {"train_lengths": f"{data.min_length}..{data.max_length}",
                    "eval_lengths": eval_lengths_text(self.eval_lengths),
                    "score_lengths": f"{len(scored)} lengths in {ev.score_min_length}..{ev.max_length}",
                    "samples_per_length": self.samples, "batch_size": self.cfg.train.batch_size}
        table2 = {f"{p:g}": [range_score(rows, data.min_length, data.max_length),
                             range_score(rows, ev.score_min_length, ev.max_length)]
                  for p, rows in self.evals.items() if p is not None}
        return RunRecord(
            task_id=self.task_id, model=self.model, seed=self.seed, lr=self.lr, recipe=self.recipe,
            steps=self.cfg.train.steps, d_model=self.cfg.model.d_model, parameters=self.parameters,
            train_seconds=float(self.meta.get("train_seconds", float("nan"))), score=self.score, fit=self.fit,
            trained_p_one=float(data.task_options.get("p_one", 0.5)), table2=table2, protocol=protocol,
            commit=commit, trained_at=self.meta.get("code_commit"), rule=rule_name(ev),
            kept_step=self.meta.get("kept_step"))


def collect_runs(runs_dir: str | Path, profile: str) -> tuple[list[FinishedRun], list[str]]:
    """(finished runs of `profile`, names of its unfinished runs) under ``runs_dir/<task>/<model>/<point>/``."""
    finished, pending = [], []
    for sweep_file in sorted(Path(runs_dir).glob(f"*/*/*/{SWEEP_FILE}")):
        run_dir = sweep_file.parent
        if STALE_MARK in run_dir.name:  # set aside by the sweep: trained with a recipe the profile no longer plans
            continue
        info = read_json_object(sweep_file)
        if info["profile"] != profile:
            continue
        name = str(run_dir.relative_to(runs_dir))
        if not (run_dir / MODEL_FILE).is_file():
            pending.append(name)
            continue
        cfg = saved_config(run_dir, ConfigError, read=formal_config_from_saved)
        if not isinstance(cfg, FormalConfig):
            raise ConfigError(f"{run_dir / CONFIG_FILE}: missing; {run_dir} has a model but not the config it was "
                              f"trained with")
        trained_p = cfg.data.task_options.get("p_one", 0.5)  # evaluated once, in range.jsonl (as the sweep does)
        files: dict[float | None, Path] = {None: run_dir / RANGE_FILE}
        files.update({p: run_dir / (RANGE_FILE if p == trained_p else f"range_p{p:g}.jsonl")
                      for p in info["table2_p_one"]})
        evals = {p: read_rows(path) for p, path in files.items()}
        lengths, samples = info["eval_lengths"], info["samples_per_length"]
        if not all(all(t in rows and rows[t]["n"] == samples for t in lengths) for rows in evals.values()):
            pending.append(name)
            continue
        state = torch.load(run_dir / MODEL_FILE, map_location="cpu", weights_only=True)
        finished.append(FinishedRun(
            task_id=info["task_id"], model=info["model"], seed=info["seed"], lr=info["lr"], cfg=cfg,
            eval_lengths=info["eval_lengths"], samples=info["samples_per_length"], evals=evals,
            meta=state["meta"], parameters=sum(v.numel() for v in state["state_dict"].values()),
        ))
    return finished, pending


def _cell(scores: list[float]) -> dict[str, Any]:
    return {"max": float(np.max(scores)), "mean": float(np.mean(scores)), "n": len(scores), "scores": scores}


def _ordered(values: list[str], preferred: list[str]) -> list[str]:
    return [v for v in preferred if v in values] + sorted(set(values) - set(preferred))


def table1(runs: list[RunRecord], tasks: list[str], models: list[str],
           expected: dict[tuple[str, str], int] | None = None,
           other_rule: frozenset[str] | set[str] = frozenset()) -> dict[str, dict[str, dict[str, Any]]]:
    """{task: {model: {"max", "mean", "n", "scores", "recipes", "expected", "fits", "unfit", "rules",
    "other_rule"}}} over the finished runs of each (task, model); `fits` holds each run's fit (None: not evaluated
    on training lengths), `unfit` how many are below FIT_THRESHOLD, `rules` the checkpoint rules that kept the
    runs' models, `other_rule` how many of them are named in `other_rule` (kept by another rule than the profile
    plans, which it could change). With `expected` (runs the profile plans per cell) every planned cell appears,
    n = 0 while none has finished."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    expected = expected or {}
    for task in _ordered([r.task_id for r in runs] + [t for t, _ in expected], tasks):
        for model in _ordered([r.model for r in runs] + [m for _, m in expected], models):
            mine = [r for r in runs if r.task_id == task and r.model == model]
            if not mine and (task, model) not in expected:
                continue
            cell = _cell([r.score for r in mine]) if mine else {"max": None, "mean": None, "n": 0, "scores": []}
            cell["recipes"] = sorted({r.recipe for r in mine})
            cell["fits"] = [r.fit for r in mine]
            cell["unfit"] = sum(f is not None and f < FIT_THRESHOLD for f in cell["fits"])
            cell["rules"] = sorted({r.rule for r in mine})
            cell["other_rule"] = sum(r.name in other_rule for r in mine)
            cell["expected"] = expected.get((task, model), len(mine))
            out.setdefault(task, {})[model] = cell
    return out


def table2(runs: list[RunRecord], task: str, p_values: list[float], models: list[str]) -> dict[str, Any]:
    """{"train_lengths"|"extrapolation": {model: {P(1): cell}}} for the runs of `task` trained at P(1) = 0.5."""
    runs = [r for r in runs if r.task_id == task and r.trained_p_one == 0.5]
    out: dict[str, Any] = {"train_lengths": {}, "extrapolation": {}}
    for model in _ordered([r.model for r in runs], models):
        mine = [r for r in runs if r.model == model]
        for p in (f"{p:g}" for p in p_values):
            for i, key in enumerate(("train_lengths", "extrapolation")):
                scores = [r.table2[p][i] for r in mine if p in r.table2]
                if scores:
                    out[key].setdefault(model, {})[p] = _cell(scores)
    return out


def _protocol(runs: list[RunRecord]) -> dict[str, Any]:
    """Length ranges and sample counts actually used, per task (read from the runs)."""
    out: dict[str, Any] = {}
    for r in runs:
        out.setdefault(r.task_id, [])
        if r.protocol not in out[r.task_id]:
            out[r.task_id].append(r.protocol)
    return out


def _settings(runs: list[RunRecord]) -> list[dict[str, Any]]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in runs:
        row = rows.setdefault((r.task_id, r.model), {
            "task": r.task_id, "model": r.model, "steps": r.steps, "lrs": set(), "seeds": set(),
            "d_model": r.d_model, "parameters": r.parameters, "train_seconds": []})
        row["lrs"].add(r.lr)
        row["seeds"].add(r.seed)
        row["train_seconds"].append(r.train_seconds)
    return [{**row, "lrs": sorted(row["lrs"]), "seeds": sorted(row["seeds"]),
             "train_seconds": float(np.mean(row["train_seconds"]))} for row in rows.values()]


def write_tables(runs_dir: str | Path, profile: Profile, out_dir: str | Path, *, specs: list[RunSpec] | None = None,
                 command: list[str] | None = None, keep: str | Path | None = None,
                 log: Callable[[str], None] = print) -> list[Path]:
    """Write table1_<profile>.md/.json and table2_<profile>.md/.json; returns their paths.

    A table equal to the one on disk but for its provenance stamp is left byte-identical; one that differs is
    replaced, and `log` gets one line per table saying what changed (:mod:`~regulargpt.experiments.table_changes`).

    `specs` (the profile's planned runs) make every planned cell appear, with how many of its runs are finished;
    only finished runs whose recipe is one the profile plans are counted (others are listed as stale). `keep` (a
    table1 JSON written earlier) adds its run records (:mod:`~regulargpt.experiments.formal_records`) for the runs
    `runs_dir` does not hold; a run folder found there replaces its record."""
    profile_name, tasks, models = profile.name, profile.tasks, profile.models
    table2_task, table2_p_one = profile.table2_task, profile.table2_p_one
    prov = provenance(" ".join(command or sys.argv))
    found, pending = collect_runs(runs_dir, profile_name)
    runs = [r.record(prov["commit"]) for r in found]
    fresh = {r.name for r in runs}
    carried = [r for r in (read_records(keep) if keep is not None else []) if r.name not in fresh]
    runs += carried
    pending = [name for name in pending if name not in {r.name for r in carried}]
    expected: dict[tuple[str, str], int] = {}
    cell_rule: dict[tuple[str, str], str] = {}
    for spec in specs or []:
        expected[(spec.task_id, spec.model)] = expected.get((spec.task_id, spec.model), 0) + 1
        cell_rule.setdefault((spec.task_id, spec.model), spec.rule)
    standing = standings(runs, specs) if specs is not None else {}
    stale = [r for r in runs if standing.get(r.name) == STALE]
    runs = sorted((r for r in runs if all(r is not x for x in stale)), key=lambda r: r.name)
    carried = [r for r in carried if r in runs]
    pending += [f"{r.name} {STALE_NOTE}" for r in stale]
    other_rule = {name for name, s in standing.items() if s == OTHER_RULE}
    out_dir = Path(out_dir)
    t1, proto, settings = table1(runs, tasks, models, expected, other_rule), _protocol(runs), _settings(runs)
    task_order = _ordered([s["task"] for s in settings], tasks)
    model_order = _ordered([s["model"] for s in settings], models)
    settings.sort(key=lambda s: (task_order.index(s["task"]), model_order.index(s["model"])))
    cols = _ordered(sorted({m for row in t1.values() for m in row}), models)
    md = header_lines("Table 1: regular-language length extrapolation", prov, profile_name, pending, carried, runs,
                 rule_lines(runs, standing, cell_rule))
    md += protocol_lines(proto)
    md += ["Cells: max / mean over seeds × learning rates of the score (number of finished runs; a cell whose "
           "runs are not all finished says how many of the planned runs it holds). † = at least one of the cell's "
           f"runs did not fit its training lengths (mean accuracy over them < {FIT_THRESHOLD:g}): there a low score "
           "is a failure to learn the task, not to extrapolate it. Below each section, the same runs' fit: max / "
           "mean over the runs of the mean accuracy over the training lengths."
           + (" ‡ = the cell holds runs whose model the last-model rule kept and the profile's checkpoint rule "
              "could change (not trained again yet; the header counts them)." if other_rule else "")]
    sections = profile.sections or {"": list(t1)}
    rest = [t for t in t1 if not any(t in members for members in sections.values())]
    if rest:
        sections = {**sections, "Other tasks": rest}
    for title, members in sections.items():
        rows = [t for t in members if t in t1]
        if not rows:
            continue
        md += [""] + ([f"### {title}", ""] if title else [])
        md += ["| task | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        md += [f"| {task} | " + " | ".join(cell_text(t1[task].get(m)) + marks(t1[task].get(m)) for m in cols) + " |"
               for task in rows]
        md += ["", f"Fit on the training lengths{f' ({title})' if title else ''}:", "",
               "| task | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        md += [f"| {task} | " + " | ".join(fit_text(t1[task].get(m)) for m in cols) + " |" for task in rows]
    md += ["", "Run settings:", "",
           "| task | model | steps | lrs | seeds | d_model | parameters | mean training wall s |",
           "|---|---|---|---|---|---|---|---|"]
    md += [f"| {s['task']} | {s['model']} | {s['steps']} | {', '.join(f'{x:g}' for x in s['lrs'])} | "
           f"{', '.join(map(str, s['seeds']))} | {s['d_model']} | {s['parameters']} | {s['train_seconds']:.0f} |"
           for s in settings]
    written = []
    stem = out_dir / f"table1_{profile_name}"
    payload = {"provenance": prov, "profile": profile_name, "protocol": proto, "pending": pending,
               "settings": settings, "sections": profile.sections, "table": t1, "runs": dump_records(runs)}
    written += _write(stem, "\n".join(md) + "\n", payload, log)

    t2 = table2(runs, table2_task, table2_p_one, models)
    ps = [f"{p:g}" for p in table2_p_one]
    t2_runs = [r for r in runs if r.task_id == table2_task]
    t2_other = {r.model for r in t2_runs if r.name in other_rule}  # ‡ after the model: see Table 1's note
    md = header_lines(f"Table 2: {table2_task} trained at P(1) = 0.5, evaluated at other P(1)", prov, profile_name,
                 [p for p in pending if p.startswith(f"{table2_task}/")],
                 [r for r in carried if r.task_id == table2_task], (),
                 rule_lines(t2_runs, standing, {k: v for k, v in cell_rule.items() if k[0] == table2_task}))
    md += protocol_lines({k: v for k, v in proto.items() if k == table2_task})
    md += ["Cells: max / mean over seeds × learning rates of the mean accuracy over the lengths named "
           "(number of runs)."]
    for key, title in (("train_lengths", "training lengths"), ("extrapolation", "extrapolation lengths")):
        rng = next((e["train_lengths"] if key == "train_lengths" else e["score_lengths"]
                    for e in proto.get(table2_task, [])), "")
        md += ["", f"Over the {title} ({rng}):", "", "| model | " + " | ".join(f"P(1)={p}" for p in ps) + " |",
               "|---" * (len(ps) + 1) + "|"]
        md += [f"| {model}{' ‡' if model in t2_other else ''} | "
               + " | ".join(cell_text(row.get(p)) for p in ps) + " |" for model, row in t2[key].items()]
    payload = {"provenance": prov, "profile": profile_name, "task": table2_task, "p_one": table2_p_one,
               "protocol": proto.get(table2_task, []), "table": t2}
    written += _write(out_dir / f"table2_{profile_name}", "\n".join(md) + "\n", payload, log)
    return written


def _write(stem: Path, markdown: str, payload: dict[str, Any], log: Callable[[str], None]) -> list[Path]:
    md_path, json_path = stem.with_suffix(".md"), stem.with_suffix(".json")
    old = read_table(json_path)
    if same_apart_from_provenance(md_path, old, markdown, payload):
        log(f"{md_path}: unchanged but for its provenance stamp; left as it was")
        return [md_path, json_path]
    atomic_write_text(json_path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    atomic_write_text(md_path, markdown)
    log(f"{md_path}: {describe_changes(old, payload)}")
    return [md_path, json_path]
