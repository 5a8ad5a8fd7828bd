"""Sweeps of formal-language runs: tasks × models × seeds × learning rates, each trained then range-evaluated.

A *profile* (``configs/formal/profiles/<name>.json``) says what a sweep runs and at what budget::

    {"name": "quick", "description": "...",
     "tasks": ["even_pairs", ...],            # task configs configs/formal/<task>.json
     "models": ["regular_gpt_c2", ...],       # model presets configs/formal/models/<model>.json
     "seeds": [0, 1, 2],
     "lrs": {"*/*": [0.001]},                 # "task/model" glob -> lr grid; last match wins; none: the config's lr
     "overrides": {"*/*": {"train": {"steps": 2000}}, "parity_check/*": {"train": {"steps": 4000}}},
     "eval_lengths": "1-40,41-500:20",        # parse_lengths spec; "" = every length 1..eval.max_length
     "table2_task": "parity_check", "table2_p_one": [0.1, 0.3, 0.5, 0.7, 0.9],
     "sections": {"Deletang et al. (2023) tasks": ["even_pairs", ...], ...}}   # optional Table 1 sections

One run's config = task config ← model preset ← every matching ``overrides`` entry (in file order) ← ``--set``
overrides ← ``train.seed`` and ``train.lr`` of the grid point. It lives in ``OUT/<task>/<model>/seed<S>_lr<LR>/``
(``regulargpt.train.formal_trainer`` layout; file names in :mod:`regulargpt.run_directory.layout`) with ``sweep.json``
(profile, grid point, eval lengths and sample count), ``range.jsonl`` (range evaluation at the training task
options) and, for the Table 2 task, ``range_p<P>.jsonl`` (the same evaluation with the task option ``p_one = P``; the training value reuses
``range.jsonl``). A run is finished when ``model.pt`` exists and every evaluation file has all its lengths; finished
runs are skipped, unfinished ones resume from their checkpoint and evaluation rows. A run folder trained with
another recipe than the profile now plans (e.g. after a step count changed) is *stale*: the sweep renames it to
``seed<S>_lr<LR>.stale-<its recipe id>`` (kept for inspection; the tables skip such folders) and trains the run
again, so rerunning the sweep command after a profile change is all it takes.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import fnmatch
import functools
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from regulargpt.checkpoint import load_model_file
from regulargpt.config import (
    ConfigError,
    FormalConfig,
    apply_overrides,
    build_section,
    config_to_dict,
    formal_config_from_saved,
    load_config,
    load_config_dict,
    merge_dicts,
    read_json,
)
from regulargpt.evaluation.formal_scoring import (
    check_lengths,
    missing_lengths,
    parse_lengths,
    range_evaluate,
    range_score,
    read_rows,
)
from regulargpt.files import atomic_write_text
from regulargpt.run_directory import saved_config
from regulargpt.run_directory.layout import MODEL_FILE, RANGE_FILE, SWEEP_FILE
from regulargpt.tasks import Task, make_task
from regulargpt.train.formal_selection import rule_name
from regulargpt.train.formal_trainer import formal_task, train_formal

__all__ = [
    "Profile",
    "RunSpec",
    "eval_files",
    "execute_run",
    "is_finished",
    "load_profile",
    "plan_runs",
    "recipe_id",
    "run_sweep",
    "stale_recipe",
]

_CONFIG_SECTIONS = ("model", "data", "train", "eval", "logging")


@dataclass
class Profile:
    """A sweep budget (see the module docstring for the file format)."""

    name: str
    description: str
    tasks: list[str]
    models: list[str]
    seeds: list[int]
    lrs: dict[str, list[float]] = field(default_factory=dict)
    overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    eval_lengths: str = ""
    table2_task: str = "parity_check"
    table2_p_one: list[float] = field(default_factory=list)
    sections: dict[str, list[str]] = field(default_factory=dict)  # Table 1 sections: title -> tasks (in order)


def _names(folder: Path) -> str:
    return ", ".join(sorted(p.stem for p in folder.glob("*.json") if p.stem != "base")) or "none"


def load_profile(name_or_path: str, configs_dir: str | Path = "configs/formal") -> Profile:
    """A profile by name (``configs/formal/profiles/<name>.json``) or by path; unknown keys, wrong types and
    malformed JSON are ConfigErrors naming the file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = Path(configs_dir) / "profiles" / f"{name_or_path}.json"
    if not path.is_file():
        raise ConfigError(f"{path}: profile not found; available: {_names(path.parent)}")
    raw = read_json(path)
    required = [name for name, f in Profile.__dataclass_fields__.items()
                if f.default is MISSING and f.default_factory is MISSING and name not in raw]
    if required:
        raise ConfigError(f"{path}: missing key(s) {', '.join(required)}")
    try:
        profile = build_section(Profile, raw, "profile")
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    for pattern, delta in profile.overrides.items():
        bad = sorted(set(delta) - set(_CONFIG_SECTIONS))
        if bad:
            raise ConfigError(f"{path}: overrides[{pattern!r}]: unknown section(s) {', '.join(bad)}")
    return profile


@dataclass
class RunSpec:
    """One grid point: where it runs, its resolved config, and what to evaluate."""

    profile: str
    task_id: str
    model: str
    seed: int
    lr: float
    run_dir: Path
    cfg: FormalConfig
    eval_lengths: list[int]
    table2_p_one: list[float]

    @property
    def name(self) -> str:
        return f"{self.task_id}/{self.model}/seed{self.seed}_lr{self.lr:g}"

    @property
    def recipe(self) -> str:
        """:func:`recipe_id` of this grid point's config."""
        return recipe_id(self.cfg)

    @property
    def rule(self) -> str:
        """The checkpoint rule the run keeps its model by (:func:`regulargpt.train.formal_selection.rule_name`)."""
        return rule_name(self.cfg.eval)

    @property
    def last_model_recipe(self) -> str:
        """The recipe of the same training kept by the last-model rule (eval.select_last = 1): a run record with it
        was trained exactly as this grid point trains, and only its kept checkpoint may differ."""
        cfg = dataclasses.replace(self.cfg, eval=dataclasses.replace(self.cfg.eval, select_last=1))
        return recipe_id(cfg)


def recipe_id(cfg: FormalConfig) -> str:
    """A short hash of what a run trains and how: the config values that differ from the code's defaults, without
    the seed and bookkeeping (logging, checkpoint cadence). Tables record it per cell so that a committed table made
    with another recipe is detected as stale; a field added later with a default does not change it. The checkpoint
    rule (eval.select_last, select_every) is part of it; select_every alone is not, with select_last = 1 (the last
    model) it changes nothing."""
    import hashlib

    skip = {("train", "seed"), ("train", "log_every"), ("train", "save_every"), ("train", "keep_last")}
    if cfg.eval.select_last == 1:
        skip.add(("eval", "select_every"))
    recipe = {}
    for section in ("model", "data", "train", "eval"):
        values, defaults = getattr(cfg, section), type(getattr(cfg, section))()
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            if (section, f.name) not in skip and value != getattr(defaults, f.name):
                recipe[f"{section}.{f.name}"] = value
    return hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _overlay(raw: dict[str, Any], delta: dict[str, Any], where: str) -> dict[str, Any]:
    """`raw` with a preset's or profile's `delta` merged over it (:func:`regulargpt.config.merge_dicts`, the merge
    ``"extends"`` uses); every top-level key of `delta` must be a config section object."""
    for section, values in delta.items():
        if section not in _CONFIG_SECTIONS or not isinstance(values, dict):
            raise ConfigError(f"{where}: {section!r} is not a config section object ({', '.join(_CONFIG_SECTIONS)})")
    return merge_dicts(copy.deepcopy(raw), delta)  # a copy: callers keep `raw` for other grid points


def _matching(table: dict[str, Any], key: str) -> list[Any]:
    return [value for pattern, value in table.items() if fnmatch.fnmatchcase(key, pattern)]


def plan_runs(
    profile: Profile,
    out_dir: str | Path,
    *,
    configs_dir: str | Path = "configs/formal",
    tasks: list[str] | None = None,
    models: list[str] | None = None,
    seeds: list[int] | None = None,
    lrs: list[float] | None = None,
    sets: list[str] | None = None,
) -> list[RunSpec]:
    """Every grid point of the sweep, seed-major (seed, task, model, lr), so that a partial sweep already fills
    every table cell once; configs are validated here, before anything runs."""
    configs_dir = Path(configs_dir)
    bases: list[tuple[str, str, dict[str, Any], list[float]]] = []
    for task_id in tasks or profile.tasks:
        task_path = configs_dir / f"{task_id}.json"
        if not task_path.is_file():
            raise ConfigError(f"{task_path}: unknown task config {task_id!r}; available: {_names(configs_dir)}")
        task_raw = config_to_dict(load_config(task_path, kind=FormalConfig))
        for model in models or profile.models:
            preset = configs_dir / "models" / f"{model}.json"
            if not preset.is_file():
                raise ConfigError(f"{preset}: unknown model preset {model!r}; available: {_names(preset.parent)}")
            raw = _overlay(task_raw, read_json(preset), str(preset))
            key = f"{task_id}/{model}"
            for pattern, delta in profile.overrides.items():
                if fnmatch.fnmatchcase(key, pattern):
                    raw = _overlay(raw, delta, f"profile {profile.name} overrides[{pattern!r}]")
            raw = apply_overrides(raw, sets or [], FormalConfig)
            bases.append((task_id, model, raw, lrs or (_matching(profile.lrs, key) or [[raw["train"]["lr"]]])[-1]))
    specs = []
    for seed in seeds if seeds is not None else profile.seeds:
        for task_id, model, raw, grid in bases:
            for lr in grid:
                point = _overlay(raw, {"train": {"seed": seed, "lr": float(lr)}, "logging": {"progress": False}},
                                 f"{task_id}/{model}")
                cfg = load_config_dict(point, f"{task_id}/{model} (profile {profile.name})", FormalConfig)
                formal_task(cfg)  # vocab/classes must match the task: fail before anything runs
                lengths = parse_lengths(profile.eval_lengths, cfg.eval.max_length)
                check_lengths(cfg.model, lengths, f"{task_id}/{model} (profile {profile.name})")
                specs.append(RunSpec(
                    profile=profile.name, task_id=task_id, model=model, seed=seed, lr=float(lr),
                    run_dir=Path(out_dir) / task_id / model / f"seed{seed}_lr{float(lr):g}", cfg=cfg,
                    eval_lengths=lengths,
                    table2_p_one=profile.table2_p_one if cfg.data.task == profile.table2_task else [],
                ))
    return specs


def eval_files(spec: RunSpec) -> dict[Path, Task]:
    """Evaluation file → the task it evaluates: range.jsonl, plus range_p<P>.jsonl for the Table 2 P(1) values."""
    files = {spec.run_dir / RANGE_FILE: formal_task(spec.cfg)}
    trained_p = spec.cfg.data.task_options.get("p_one", 0.5)
    for p in spec.table2_p_one:
        if p != trained_p:
            options = {**spec.cfg.data.task_options, "p_one": p}
            files[spec.run_dir / f"range_p{p:g}.jsonl"] = make_task(spec.cfg.data.task, **options)
    return files


STALE_MARK = ".stale-"  # a set-aside run folder: <run>.stale-<recipe id>


def stale_recipe(spec: RunSpec) -> str | None:
    """The recipe id a run folder was trained with when it is not the one `spec` plans; None when the folder has no
    saved config or its recipe is current."""
    saved = saved_config(spec.run_dir, ConfigError, read=formal_config_from_saved)
    if saved is None or recipe_id(saved) == spec.recipe:
        return None
    return recipe_id(saved)


def set_aside_stale(spec: RunSpec) -> Path | None:
    """Rename ``spec.run_dir`` to ``<name>.stale-<recipe>`` when its saved config was trained with another recipe
    than `spec` plans (``.stale-<recipe>-1``, ``-2`` if taken) → the new path; None when there is no saved config or
    the recipe is current. E.g. a profile's Tomita 5 steps raised from 2,100 to 6,600: every Tomita 5 run folder is set
    aside and retrained."""
    old = stale_recipe(spec)
    if old is None:
        return None
    base = spec.run_dir.with_name(f"{spec.run_dir.name}{STALE_MARK}{old}")
    target, n = base, 1
    while target.exists():
        target, n = base.with_name(f"{base.name}-{n}"), n + 1
    os.replace(spec.run_dir, target)
    return target


def is_finished(spec: RunSpec) -> bool:
    if not (spec.run_dir / MODEL_FILE).is_file():
        return False
    samples = spec.cfg.eval.samples_per_length
    return all(not missing_lengths(path, spec.eval_lengths, samples) for path in eval_files(spec))


def execute_run(spec: RunSpec, device: str = "cpu", stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train (or resume) and range-evaluate one run on `device` → a summary row; an exception is caught and
    reported. `stop` is asked after every training step and before every evaluation file: once it answers True the
    run checkpoints and the row says ``"stopped": True`` (a rerun resumes it)."""
    start = time.perf_counter()
    stopped = {"run": spec.name, "score": float("nan"), "seconds": 0.0, "error": "", "stopped": True}
    try:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(spec.run_dir / SWEEP_FILE, json.dumps({
            "profile": spec.profile, "task_id": spec.task_id, "model": spec.model, "seed": spec.seed, "lr": spec.lr,
            "eval_lengths": spec.eval_lengths, "samples_per_length": spec.cfg.eval.samples_per_length,
            "table2_p_one": spec.table2_p_one, "device": str(device),
        }, indent=1) + "\n")
        model_path = train_formal(spec.cfg, spec.run_dir, device=device, stop=stop)
        if model_path is None:
            return {**stopped, "seconds": time.perf_counter() - start}
        _, model, _ = load_model_file(model_path)
        model.to(device)
        for path, task in eval_files(spec).items():
            if stop is not None and stop():
                return {**stopped, "seconds": time.perf_counter() - start}
            range_evaluate(model, task, spec.eval_lengths, spec.cfg.eval.samples_per_length, path, progress=False)
        ev = spec.cfg.eval
        score = range_score(read_rows(spec.run_dir / RANGE_FILE), ev.score_min_length, ev.max_length)
        return {"run": spec.name, "score": score, "seconds": time.perf_counter() - start, "error": "", "stopped": False}
    except Exception as err:  # one broken run must not stop a long sweep; it is reported and retried next time
        atomic_write_text(spec.run_dir / "error.txt", traceback.format_exc())
        return {"run": spec.name, "score": float("nan"), "seconds": time.perf_counter() - start,
                "error": f"{type(err).__name__}: {err}", "stopped": False}


def _worker_init(threads: int, parent_pid: int | None = None) -> None:
    """Set the worker's torch threads; a pool worker (``parent_pid`` given) also asks Linux to send it SIGTERM when
    its parent dies (``prctl(PR_SET_PDEATHSIG)``), so that killing the sweep process stops its workers too instead of
    leaving them training orphaned (their checkpoints are atomic: the runs resume). Elsewhere a no-op."""
    torch.set_num_threads(threads)
    if parent_pid is None or not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def run_sweep(specs: list[RunSpec], *, workers: int = 1, threads: int = 1, device: str = "cpu") -> list[dict[str, Any]]:
    """Run every unfinished spec (``workers`` processes of ``threads`` torch threads, models on `device`); one log
    line per run. Stale run folders (another recipe) are set aside first and their runs trained again."""
    for spec in specs:
        aside = set_aside_stale(spec)
        if aside is not None:
            print(f"{spec.name}: trained with another recipe; set aside as {aside.name}, training it again", flush=True)
    todo = [spec for spec in specs if not is_finished(spec)]
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="runs", dynamic_ncols=True)
    results = []

    def report(result: dict[str, Any]) -> None:
        results.append(result)
        status = f"score={result['score']:.4f}" if not result["error"] else f"FAILED {result['error']}"
        bar.write(f"{result['run']}: {status} ({result['seconds']:.0f}s)")
        bar.update(1)

    if workers <= 1:
        _worker_init(threads)
        for spec in todo:
            report(execute_run(spec, device))
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(workers, _worker_init, (threads, os.getpid())) as pool:
            for result in pool.imap_unordered(functools.partial(execute_run, device=device), todo):
                report(result)
    bar.close()
    return results
