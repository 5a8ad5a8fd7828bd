"""One finished formal run as Tables 1 and 2 need it: a :class:`RunRecord`, kept in the table's JSON.

A sweep's run folders are not committed (they are large and a session's machine does not outlive it), so the
committed ``table1_<profile>.json`` holds one record per counted run under ``"runs"``. The next aggregation reads
them back (``eval/formal.py aggregate`` keeps the out-dir's table by default): a run whose folder is gone is carried
from its record while the profile still plans its recipe, and a run found in ``--runs`` replaces its record. So a
profile change for a few tasks reruns only those tasks, and a table fills over several sittings.

Example record (what ``"runs"`` holds, one per run)::

    {"task_id": "parity_check", "model": "regular_gpt_c2", "seed": 1, "lr": 0.001, "recipe": "b41706626ea8",
     "steps": 1000, "d_model": 64, "parameters": 50066, "train_seconds": 31.2, "score": 1.0, "fit": 1.0,
     "trained_p_one": 0.5, "table2": {"0.1": [1.0, 1.0], "0.5": [1.0, 1.0]},
     "protocol": {"train_lengths": "1..40", ...}, "commit": "93125fb6419d", "trained_at": "c9976a31d441",
     "rule": "best-fit-of-5-every-100", "kept_step": 900}

``table2`` maps each evaluated P(1) to [mean accuracy over the training lengths, over the score lengths];
``commit`` is the commit of the aggregation that first read the run from its folder; ``trained_at`` the commit of
the code that trained it (model.pt's ``code_commit``; absent in runs trained before it was stored). The recipe hash
covers the config only: a numerically equivalent code change can still change a run (21f8a76 moved Even Pairs
seed 0 from 0.980 to 0.999, docs/FORMAL.md), and ``trained_at`` tells which code a record's run saw. ``rule``
names the checkpoint rule that chose the run's model (:mod:`regulargpt.train.formal_selection`; records written
before the rule existed are ``"last"``) and ``kept_step`` the step of that model (None: the last step).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from regulargpt.config import ConfigError
from regulargpt.files import CorruptFileError, read_json_object
from regulargpt.train.formal_selection import same_under_rule

if TYPE_CHECKING:
    from regulargpt.experiments.formal_sweep import RunSpec

__all__ = ["OTHER_RULE", "PLANNED", "SAME_MODEL", "STALE", "RunRecord", "dump_records", "eval_lengths_text",
           "read_records", "standing", "standings"]

# How a record stands against what the profile plans for its cell (:func:`standing`):
PLANNED = "planned"  # trained with a recipe the profile plans, checkpoint rule included
SAME_MODEL = "same model"  # trained as planned but kept by the last-model rule, and fit 1.0: the rule keeps it too
OTHER_RULE = "other rule"  # trained as planned but kept by the last-model rule, which the planned rule could change
STALE = "stale"  # trained with a recipe the profile no longer plans


@dataclass(frozen=True)
class RunRecord:
    task_id: str
    model: str
    seed: int
    lr: float
    recipe: str  # recipe_id of the run's config: the profile still plans the run when it plans this recipe
    steps: int
    d_model: int
    parameters: int
    train_seconds: float
    score: float  # mean accuracy over the score lengths (41..500)
    fit: float | None  # mean accuracy over the evaluated training lengths; None when none was evaluated
    trained_p_one: float  # the P(1) the run was trained at (Table 2 counts runs trained at 0.5)
    table2: dict[str, list[float]]  # "P(1)" -> [training-length score, score-length score]
    protocol: dict[str, Any]  # length ranges, samples per length and batch size, as the table's protocol lines
    commit: str
    trained_at: str | None = None  # model.pt's code_commit: the code that trained the run (None: not recorded)
    rule: str = "last"  # the checkpoint rule that kept the run's model (formal_selection.rule_name)
    kept_step: int | None = None  # the step of the kept model (None: the last step, train.steps)

    @property
    def name(self) -> str:
        """``<task>/<model>/seed<seed>_lr<lr>``, the run folder's path under the sweep's runs folder."""
        return f"{self.task_id}/{self.model}/seed{self.seed}_lr{self.lr:g}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any, where: str) -> RunRecord:
        """A record from its JSON object; a missing or extra key is a ConfigError naming `where` and the key."""
        names = [f.name for f in fields(cls)]
        required = [f.name for f in fields(cls) if f.default is MISSING]
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a run record (a JSON object), got {type(raw).__name__}")
        missing, extra = [n for n in required if n not in raw], sorted(set(raw) - set(names))
        if missing or extra:
            raise ConfigError(f"{where}: run record keys missing {missing}, unknown {extra}; expected {names}")
        return cls(**raw)


def read_records(path: str | Path) -> list[RunRecord]:
    """The run records of a table JSON written by :func:`~regulargpt.experiments.formal_tables.write_tables`.

    A table without ``"runs"`` (written before records were kept) is an error that says so: its runs cannot be
    carried and must be aggregated from their folders."""
    path = Path(path)
    try:
        payload = read_json_object(path, kind="table JSON")
    except CorruptFileError as err:
        raise ConfigError(str(err)) from None
    if "runs" not in payload:
        raise ConfigError(f"{path}: holds no 'runs' (per-run records); aggregate again from the run folders "
                          f"(--runs) with --fresh")
    if not isinstance(payload["runs"], list):
        raise ConfigError(f"{path}: 'runs' must be a list of run records")
    return [RunRecord.from_json(raw, f"{path}: runs[{i}]") for i, raw in enumerate(payload["runs"])]


def eval_lengths_text(lengths: Iterable[int]) -> str:
    """A record's ``protocol["eval_lengths"]``: ``"60 lengths in 1..478"``."""
    lengths = sorted(set(lengths))
    return f"{len(lengths)} lengths in {lengths[0]}..{lengths[-1]}"


def standing(record: RunRecord, spec: RunSpec) -> str | None:
    """How `record` stands against the planned grid point `spec` of its cell: PLANNED (its recipe), SAME_MODEL or
    OTHER_RULE (the same training, kept by the last-model rule while `spec` plans another; SAME_MODEL when its fit
    was 1.0 over every training length, :func:`~regulargpt.train.formal_selection.same_under_rule`), None when
    `record` was trained otherwise."""
    if record.recipe == spec.recipe:
        return PLANNED
    if record.recipe != spec.last_model_recipe or record.rule == spec.rule:
        return None
    data = spec.cfg.data
    covered = (set(range(data.min_length, data.max_length + 1)) <= set(spec.eval_lengths)
               and record.protocol.get("eval_lengths") == eval_lengths_text(spec.eval_lengths))
    return SAME_MODEL if same_under_rule(record.fit, record.rule, covered) else OTHER_RULE


def standings(records: list[RunRecord], specs: list[RunSpec]) -> dict[str, str]:
    """Record name → its standing against the planned grid points of its (task, model) cell: the best of
    PLANNED, SAME_MODEL, OTHER_RULE over them, STALE when none plans its training."""
    cells: dict[tuple[str, str], list[RunSpec]] = {}
    for spec in specs:
        cells.setdefault((spec.task_id, spec.model), []).append(spec)
    order = [PLANNED, SAME_MODEL, OTHER_RULE]
    out = {}
    for record in records:
        found = {standing(record, spec) for spec in cells.get((record.task_id, record.model), [])}
        out[record.name] = next((s for s in order if s in found), STALE)
    return out


def dump_records(records: list[RunRecord]) -> list[dict[str, Any]]:
    """JSON-ready records in the table's order (by run name, as the runs folder sorts)."""
    return [r.to_json() for r in sorted(records, key=lambda r: r.name)]

