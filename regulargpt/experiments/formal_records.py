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
     "protocol": {"train_lengths": "1..40", ...}, "commit": "93125fb6419d", "trained_at": "c9976a31d441"}

``table2`` maps each evaluated P(1) to [mean accuracy over the training lengths, over the score lengths];
``commit`` is the commit of the aggregation that first read the run from its folder; ``trained_at`` the commit of
the code that trained it (model.pt's ``code_commit``; absent in runs trained before it was stored). The recipe hash
covers the config only: a numerically equivalent code change can still change a run (21f8a76 moved Even Pairs
seed 0 from 0.980 to 0.999, docs/FORMAL.md), and ``trained_at`` tells which code a record's run saw.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from regulargpt.config import ConfigError
from regulargpt.files import CorruptFileError, read_json_object

__all__ = ["RunRecord", "dump_records", "read_records"]


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


def dump_records(records: list[RunRecord]) -> list[dict[str, Any]]:
    """JSON-ready records in the table's order (by run name, as the runs folder sorts)."""
    return [r.to_json() for r in sorted(records, key=lambda r: r.name)]

