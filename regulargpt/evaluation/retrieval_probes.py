"""Retrieval probes: can a language model use a token far back? Passkey retrieval and copying, on its own tokenizer.

**passkey** (Mohtashami & Jaggi 2023; RULER's needle): a random 5-digit key is hidden at depth δ of filler text,

    "Find the pass key.\n"  filler[:round(δ·F)]  "The pass key is 12345. Remember it. "  filler[round(δ·F):F]
    "What is the pass key? The pass key is "  12345

each segment encoded on its own and concatenated, F filler tokens chosen so that the model reads exactly L tokens
(inputs: all but the key's last token). Scored by log-likelihood ranking, not greedy decoding (small models rarely
emit five right digits): the true key and :data:`DISTRACTORS` other random 5-digit keys are each appended to the
same prompt; correct when the true key's Σ log p is strictly the highest (a tie is wrong). Chance = 1/(1 + 9).

**copy**: a span of :data:`COPY_SPAN` distinct random tokens, then random filler tokens (none of them in the span),
then the span again ending at the window's end; the first copy starts at depth δ of the room before the second,
so its distance (start to start) is L − m − round(δ·(L − 2m)). Accuracy = teacher-forced next-token argmax
accuracy over the second copy's tokens 1 … m−1 (its first token cannot be predicted).

Every trial is a function of (seed, probe, L, trial): the same keys at every depth, the same run every time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from regulargpt.data import Tokenizer
from regulargpt.evaluation.perplexity import EvalError

__all__ = ["COPY_SPAN", "DISTRACTORS", "PROBES", "copy_case", "effective_length", "min_length", "passkey_case",
           "probe_accuracy"]

PROBES = ("passkey", "copy")
DISTRACTORS = 9
COPY_SPAN = 16
INTRO = "Find the pass key.\n"  # short: the tiny configs train at 64 tokens of a 2-characters-per-token vocabulary
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "\nWhat is the pass key? The pass key is "

Logits = Callable[[Tensor], Tensor]  # (B, T) token ids → (B, T, V) logits


@dataclass(frozen=True)
class Case:
    """One trial: `candidates` (B, L + 1) full sequences (row 0 the truth); the model reads [:, :-1] and the
    targets [:, score_from:] are scored (predicted at input positions score_from − 1 …). `answer_at`: where the hidden key (passkey) or first copy (copy) starts."""

    candidates: Tensor
    score_from: int
    answer_at: int


def _rng(seed: int, probe: str, length: int, trial: int) -> np.random.Generator:
    return np.random.default_rng([seed, PROBES.index(probe), length, trial])


def _needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. "


def min_length(probe: str, tok: Tokenizer) -> int:
    """The shortest length a probe fits in: passkey with no filler (key 00000), copy 2·COPY_SPAN."""
    if probe == "copy":
        return 2 * COPY_SPAN
    return len(tok.encode(INTRO)) + len(tok.encode(_needle("00000"))) + len(tok.encode(QUESTION)) + 5 - 1


def passkey_case(tok: Tokenizer, length: int, depth: float, seed: int, trial: int) -> Case:
    """The passkey prompt of `length` input tokens with the key at `depth` ∈ [0, 1], and its 1 + DISTRACTORS
    candidate answers (see the module docstring)."""
    rng = _rng(seed, "passkey", length, trial)
    keys = [str(k) for k in rng.choice(np.arange(10_000, 100_000), 1 + DISTRACTORS, replace=False)]
    answers = [tok.encode(k) for k in keys]
    if len({len(a) for a in answers}) != 1:
        raise EvalError(f"tokenizer {tok.path}: 5-digit keys encode to different lengths; the passkey probe needs "
                        f"a tokenizer that spells numbers digit by digit (data_prep's split_digits)")
    intro, needle, question = tok.encode(INTRO), tok.encode(_needle(keys[0])), tok.encode(QUESTION)
    room = length + 1 - len(intro) - len(needle) - len(question) - len(answers[0])
    if room < 0:
        raise EvalError(f"--probe passkey: length {length} is shorter than the prompt without filler "
                        f"({min_length('passkey', tok)} tokens)")
    unit = tok.encode(FILLER)
    filler = (unit * (room // len(unit) + 1))[:room]
    before = round(depth * room)
    prompt = intro + filler[:before] + needle + filler[before:] + question
    rows = torch.tensor([prompt + a for a in answers])  # (1 + DISTRACTORS, L + 1)
    return Case(rows, len(prompt), len(intro) + before)


def copy_case(vocab: Sequence[int], length: int, depth: float, seed: int, trial: int) -> Case:
    """The copy sequence of `length` inputs (+1 target) drawn from the token ids `vocab`, first copy at `depth`."""
    if length < 2 * COPY_SPAN:
        raise EvalError(f"--probe copy: length {length} < {2 * COPY_SPAN} (two spans of {COPY_SPAN} tokens)")
    rng = _rng(seed, "copy", length, trial)
    ids = np.asarray(vocab)
    span = rng.choice(ids, COPY_SPAN, replace=False)
    rest = np.setdiff1d(ids, span)
    total = length + 1
    first = round(depth * (total - 2 * COPY_SPAN))
    seq = rng.choice(rest, total)
    seq[first:first + COPY_SPAN] = span
    seq[total - COPY_SPAN:] = span
    return Case(torch.from_numpy(seq[None].astype(np.int64)), total - COPY_SPAN + 1, first)  # tokens 1 … m−1


@torch.no_grad()
def _correct(logits_of: Logits, case: Case, probe: str, device: torch.device | str) -> float:
    ids = case.candidates.to(device)
    logp = logits_of(ids[:, :-1]).float().log_softmax(-1)[:, case.score_from - 1:]  # (B, n, V) scored positions
    targets = ids[:, case.score_from:]  # (B, n)
    if probe == "copy":  # teacher forced: the second copy's tokens 1 … m−1
        return float((logp.argmax(-1) == targets).float().mean())
    score = logp.gather(-1, targets[..., None])[..., 0].sum(-1)  # (B,) Σ log p of each candidate key
    return float(score[0] > score[1:].max())


def probe_accuracy(logits_of: Logits, probe: str, tok: Tokenizer, length: int, depths: Sequence[float],
                   trials: int, seed: int, device: torch.device | str = "cpu") -> list[dict[str, float]]:
    """Mean accuracy over `trials` at each depth: [{"depth", "accuracy", "distance"}] (distance: from the hidden
    key's or the first copy's start to the window's end, in tokens)."""
    vocab = [i for i in range(tok.vocab_size) if not (tok.sp.is_control(i) or tok.sp.is_unknown(i))]
    out = []
    for depth in depths:
        hits, distance = [], 0
        for trial in range(trials):
            case = (passkey_case(tok, length, depth, seed, trial) if probe == "passkey"
                    else copy_case(vocab, length, depth, seed, trial))
            hits.append(_correct(logits_of, case, probe, device))
            distance = length - case.answer_at
        out.append({"depth": depth, "accuracy": float(np.mean(hits)), "distance": distance})
    return out


def effective_length(accuracy: dict[int, float], threshold: float) -> int | None:
    """The longest length L such that every probed length ≤ L has accuracy ≥ `threshold`; None when the shortest
    already falls below. Example: {64: 1.0, 128: 0.95, 256: 0.5, 512: 0.92}, 0.9 → 128 (512 does not count)."""
    best = None
    for length in sorted(accuracy):
        if accuracy[length] < threshold:
            break
        best = length
    return best
