"""Range evaluation of a formal-language classifier: accuracy at every test length, and the extrapolation score.

Protocol (RegularGPT's released code, after Deletang et al. 2023): for each length T in 1..max (500; Tomita 100),
draw ``samples`` (512) fresh strings of length T from the task, classify them with the model in eval mode (dropout
off) under ``torch.no_grad``, and record the accuracy. The score is the mean per-length accuracy over the lengths
``min_length..max_length`` (41..500: every length longer than the training lengths 1..40)::

    score = mean_{T in lengths, min_length <= T <= max_length} accuracy(T)

The authors' slice ``np.mean(accuracies[41:])`` averages 42..500 (it leaves out length 41); we include 41.

Data: the strings of length T come from a generator seeded with ``SeedSequence(EVAL_SEED, spawn_key=(T,))``, so every
model sees the same strings at each length, independent of the training seeds and of which lengths are evaluated.

Output: one JSONL row per length, written as soon as the length is done, e.g.
``{"length": 41, "input_length": 41, "accuracy": 0.998046875, "n": 512}`` (``input_length`` differs from
``length`` only where the task says so: modular arithmetic keeps expressions odd). Rerunning with the same file
skips the lengths already present; a last line cut short by a kill is dropped (and cut off before the next append),
so a killed evaluation continues with every length exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from regulargpt.config import ModelConfig
from regulargpt.errors import UserError
from regulargpt.files import read_jsonl
from regulargpt.tasks import Task

__all__ = [
    "EVAL_SEED", "RangeEvalError", "check_lengths", "held_out_grades", "held_out_score", "missing_lengths",
    "parse_lengths", "range_evaluate", "range_score", "read_rows",
]

EVAL_SEED = 1_000_003  # base seed of the evaluation strings (not a training seed: those are small integers)


class RangeEvalError(UserError, ValueError):
    """A bad length spec, lengths the model cannot run, or a results file made with other settings."""


def parse_lengths(spec: str, max_length: int) -> list[int]:
    """Lengths from a spec of comma-separated items ``N``, ``A-B`` or ``A-B:S`` (step S), clipped to 1..max_length.

    An empty spec means every length 1..max_length. Examples (max 500): ``"1-40,41-500:20"`` → 1..40, 41, 61, …,
    481; ``"1-40,41-500:20,500"`` adds 500; ``"1-40,41-500:51"`` → 1..40 and ten lengths 41, 92, …, 500.
    The result is sorted, without duplicates.
    """
    if not spec.strip():
        return list(range(1, max_length + 1))
    out: set[int] = set()
    for item in spec.split(","):
        item = item.strip()
        try:
            span, _, step = item.partition(":")
            lo, _, hi = span.partition("-")
            first, last, stride = int(lo), int(hi or lo), int(step or 1)
        except ValueError:
            raise RangeEvalError(f"length spec {spec!r}: bad item {item!r}; expected N, A-B or A-B:S") from None
        if first < 1 or last < first or stride < 1:
            raise RangeEvalError(f"length spec {spec!r}: bad item {item!r}; need 1 <= A <= B and S >= 1")
        out.update(t for t in range(first, last + 1, stride) if t <= max_length)
    if not out:
        raise RangeEvalError(f"length spec {spec!r} selects no length in 1..{max_length}")
    return sorted(out)


def check_lengths(model: ModelConfig, lengths: Iterable[int], where: str) -> None:
    """For learned absolute positions, lengths (from :func:`parse_lengths`, so >= 1) must be <= model.max_positions
    (RangeEvalError naming `where`, e.g. the run directory)."""
    lengths = list(lengths)
    if model.position == "learned" and max(lengths) > model.max_positions:
        raise RangeEvalError(f"{where}: evaluation length {max(lengths)} exceeds model.max_positions="
                             f"{model.max_positions}; a model with learned absolute positions cannot run past them "
                             f"(evaluate up to {model.max_positions})")


def read_rows(path: str | Path, repair: bool = False) -> dict[int, dict[str, float]]:
    """The rows of a range-evaluation JSONL file keyed by length ({} if the file does not exist).

    A torn last line is not a row; ``repair=True`` (the file's writer only) also cuts it off the file."""
    return {int(row["length"]): row for row in read_jsonl(path, repair=repair)}


def missing_lengths(path: str | Path, lengths: Iterable[int], samples: int, repair: bool = False) -> list[int]:
    """The lengths still to evaluate in `path`; rows with a different sample count are an error (never mixed)."""
    rows = read_rows(path, repair=repair)
    for length, row in rows.items():
        if row["n"] != samples:
            raise RangeEvalError(f"{path}: length {length} was evaluated with n={row['n']} samples, not {samples}; "
                             "write to another file")
    return [t for t in lengths if t not in rows]


@torch.no_grad()
def range_evaluate(
    model: nn.Module,
    task: Task,
    lengths: Iterable[int],
    samples: int,
    out_path: str | Path,
    *,
    batch_tokens: int = 16384,
    progress: bool = True,
) -> dict[int, dict[str, float]]:
    """Evaluate `model` on `samples` strings at each length not yet in `out_path`; returns all rows of the file.

    The model is put in eval mode (and left there). Strings are classified in sub-batches of at most
    ``max(1, batch_tokens // T)`` sequences; the accuracy is exact (correct / samples).
    """
    out_path = Path(out_path)
    todo = missing_lengths(out_path, lengths, samples, repair=True)
    model.eval()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("a") as handle:
        for length in tqdm(todo, desc=f"range {task.name}", disable=not progress, dynamic_ncols=True):
            correct, loss, input_length = _graded_at(model, task, length, samples, batch_tokens)
            row = {"length": length, "input_length": input_length, "accuracy": correct / samples, "n": samples,
                   "loss": loss}
            handle.write(json.dumps(row) + "\n")
            handle.flush()
    return read_rows(out_path)


def _graded_at(model: nn.Module, task: Task, length: int, samples: int,
               batch_tokens: int) -> tuple[int, float, int]:
    """(correctly classified strings out of `samples`, their mean cross-entropy in nats, input length) at `length`,
    on the fixed evaluation strings (drawn on the CPU, classified on the model's device)."""
    device = next(model.parameters()).device
    seed = int(np.random.SeedSequence(EVAL_SEED, spawn_key=(length,)).generate_state(1)[0])
    generator = torch.Generator().manual_seed(seed)
    inputs, labels = task.sample(samples, length, generator)  # (N, T'), (N,)
    chunk = max(1, batch_tokens // inputs.shape[1])
    correct, loss = 0, 0.0
    for x, y in zip(inputs.split(chunk), labels.split(chunk)):
        x, y = x.to(device), y.to(device)
        logits = model(x)  # (n, classes)
        correct += int((logits.argmax(dim=-1) == y).sum())
        loss += float(torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum"))
    return correct, loss / samples, inputs.shape[1]


@torch.no_grad()
def held_out_grades(model: nn.Module, task: Task, lengths: Iterable[int], samples: int,
                    batch_tokens: int = 16384) -> tuple[float, float]:
    """(mean accuracy, mean cross-entropy in nats) over `lengths` on the same fixed strings as
    :func:`range_evaluate`, in memory (no file); each length weighs the same.

    Leaves the model's train/eval mode and the global RNGs as they were (the time-to-solve check runs it in the
    middle of training without changing training).
    """
    was_training = model.training
    model.eval()
    try:
        graded = [_graded_at(model, task, t, samples, batch_tokens) for t in lengths]
    finally:
        model.train(was_training)
    return float(np.mean([g[0] / samples for g in graded])), float(np.mean([g[1] for g in graded]))


def held_out_score(model: nn.Module, task: Task, lengths: Iterable[int], samples: int,
                   batch_tokens: int = 16384) -> float:
    """Mean accuracy over `lengths` (:func:`held_out_grades`)."""
    return held_out_grades(model, task, lengths, samples, batch_tokens)[0]


def range_score(rows: dict[int, dict[str, float]], min_length: int, max_length: int) -> float:
    """Mean accuracy over the evaluated lengths in min_length..max_length (inclusive); an error if there are none."""
    picked = [row["accuracy"] for length, row in rows.items() if min_length <= length <= max_length]
    if not picked:
        raise RangeEvalError(f"no evaluated length in {min_length}..{max_length}")
    return float(np.mean(picked))
