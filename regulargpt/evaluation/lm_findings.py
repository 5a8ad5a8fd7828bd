"""The "What we found" section of a length-extrapolation study, computed from its result rows only.

A study names its runs ``<out>/runs/<dataset>/<variant>-seed<k>`` (eval/lm_comparison.py); a result row's ``run``
gives the variant and seed, its ``depth_policy`` the evaluation-time depth policy (None: the model's own, which is
``adaptive`` for every study variant); a row scored with an evaluation-time RoPE scaling (``rope_scaling``) belongs to
the variant ``<variant>+<rope_type>`` (``rope+yarn``). For one dataset and protocol this module computes, per
(variant, policy):

* ppl at 1× (the training length) and at the longest length, mean ± sample std over seeds;
* the extrapolation ratio ppl(longest) / ppl(1×), per seed, then mean ± std;
* the gap to a reference model (ALiBi) at 1×: mean over seeds of ppl / ppl_ref − 1, paired by seed;

and, for every variant against a base variant (the paper's settings) at the same policy, the paired per-seed
change of ppl at 1× and at the longest length. Worked example: seeds 0, 1 with ppl(1×) 100, 110 for the base and
95, 104 for a variant → changes −5.0% and −5.5% → "−5.2% ± 0.4".

A training-budget row is named with a ``_s<steps>`` suffix (``regular_gpt_s3600``, ``alibi_s3600``): it is compared
with the reference and the base *of its own budget* (``alibi_s3600``, ``regular_gpt_s3600``) when the study has them,
never with the default budget's, so a 3.6M-token RegularGPT is not scored against a 1.2M-token ALiBi.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from regulargpt.evaluation.lm_report import latest_rows

__all__ = ["Summary", "summarise", "findings_markdown", "position_gaps", "run_name", "same_budget"]

_RUN = re.compile(r"(?:^|/)runs/(?P<dataset>[^/]+)/(?P<variant>.+)-seed(?P<seed>\d+)/?$")
_BUDGET = re.compile(r"_s\d+$")


def same_budget(name: str, variant: str, present: set[str] | dict) -> str | None:
    """The row called `name` trained at `variant`'s budget: ``same_budget("alibi", "rg_c8_s400", …)`` →
    ``"alibi_s400"``; `name` itself for a default-budget variant; None when the study has no such row."""
    suffix = _BUDGET.search(variant)
    candidate = name + suffix.group(0) if suffix else name
    return candidate if candidate in present else None


def run_name(run: str) -> tuple[str, int] | None:
    """(variant, seed) of a study run path ``…/runs/<dataset>/<variant>-seed<k>``, else None.

    >>> run_name("results/lm_cpu_v2/runs/python-stdlib/rg_c8-seed2")
    ('rg_c8', 2)
    """
    match = _RUN.search(run)
    return (match["variant"], int(match["seed"])) if match else None


@dataclass
class Summary:
    """One (variant, depth policy) of a study on one dataset: per-seed ppl by length."""

    variant: str
    policy: str
    ppl: dict[int, dict[int, float]]  # length -> seed -> ppl

    def at(self, length: int) -> list[float]:
        return list(self.ppl.get(length, {}).values())

    def ratio(self, short: int, long: int) -> list[float]:
        """ppl(long) / ppl(short) for each seed that has both."""
        a, b = self.ppl.get(short, {}), self.ppl.get(long, {})
        return [b[s] / a[s] for s in sorted(set(a) & set(b))]

    def paired(self, other: Summary, length: int) -> list[float]:
        """ppl / ppl_other − 1 at `length`, for each seed both have."""
        a, b = self.ppl.get(length, {}), other.ppl.get(length, {})
        return [a[s] / b[s] - 1 for s in sorted(set(a) & set(b))]


def summarise(rows: Sequence[dict[str, Any]], dataset: str, protocol: str = "nonoverlapping") -> dict[tuple[str, str],
                                                                                                      Summary]:
    """(variant, policy) → Summary over the latest completed rows of one dataset and protocol."""
    out: dict[tuple[str, str], Summary] = {}
    for row in latest_rows(rows):
        named = run_name(row["run"])
        if row["dataset"] != dataset or row["protocol"] != protocol or row.get("skipped") or named is None:
            continue
        variant, seed = named
        if row.get("rope_scaling"):
            variant += "+" + json.loads(row["rope_scaling"])["rope_type"]
        policy = row.get("depth_policy") or (row.get("variant_config") or {}).get("model.depth_policy") or "adaptive"
        key = (variant, policy)
        out.setdefault(key, Summary(variant, policy, defaultdict(dict))).ppl[row["length"]][seed] = row["ppl"]
    return out


def position_gaps(rows: Sequence[dict[str, Any]], dataset: str, length: int, reference: str = "alibi",
                  protocol: str = "nonoverlapping") -> list[str]:
    """Markdown table: per variant (its own depth policy), mean NLL minus the reference's (of the variant's budget:
    :func:`same_budget`) at each window-position octave of length `length`, paired by seed and averaged (nats;
    > 0 = worse). Shows *where in the window* a model
    loses: e.g. RegularGPT C = 4 close to the reference at positions 0..3 (its first depth step sees them directly)
    and behind from position 4 on, where older tokens arrive only through the dilated steps."""
    nll: dict[str, dict[int, dict[tuple[int, int], float]]] = defaultdict(dict)
    for row in latest_rows(rows):
        named = run_name(row["run"])
        if (named is None or row["dataset"] != dataset or row["protocol"] != protocol or row["length"] != length
                or row.get("depth_policy") or row.get("rope_scaling") or row.get("skipped")
                or not row.get("per_position")):
            continue
        nll[named[0]][named[1]] = {(b["start"], b["end"]): b["nll"] for b in row["per_position"]}
    if reference not in nll:
        return []
    buckets = sorted(next(iter(nll[reference].values())))
    lines = ["| variant | vs | seeds | " + " | ".join(f"{a}..{e - 1}" for a, e in buckets) + " |",
             "|---|---|---:|" + "---:|" * len(buckets)]
    for variant, by_seed in sorted(nll.items(), key=lambda kv: (kv[0] != reference, kv[0])):
        ref = same_budget(reference, variant, nll)
        if ref is None or variant == ref:
            continue
        seeds = sorted(set(by_seed) & set(nll[ref]))
        if not seeds:
            continue
        gaps = [float(np.mean([by_seed[s][b] - nll[ref][s][b] for s in seeds])) for b in buckets]
        lines.append(f"| {variant} | {ref} | {len(seeds)} | " + " | ".join(f"{g:+.3f}" for g in gaps) + " |")
    return lines


def _ms(values: list[float], pct: bool = False, digits: int = 2) -> str:
    if not values:
        return "—"
    scale, unit = (100.0, "%") if pct else (1.0, "")
    mean = float(np.mean(values)) * scale
    sign = "+" if pct and mean > 0 else ""
    if len(values) < 2:
        return f"{sign}{mean:.{digits}f}{unit}"
    return f"{sign}{mean:.{digits}f}{unit} ± {float(np.std(values, ddof=1)) * scale:.{digits}f}"


def findings_markdown(rows: Sequence[dict[str, Any]], dataset: str, train_length: int, longest: int,
                      reference: str = "alibi", base: str = "regular_gpt", flat: float = 1.00,
                      close: float = 0.10) -> list[str]:
    """Markdown lines: the per-(variant, policy) table and the two questions of the study, answered with numbers:
    (a) does any RegularGPT variant extrapolate flat (mean ppl(longest)/ppl(1×) <= `flat`)? (b) is any within
    `close` of the reference's ppl at 1×? Then each knob's paired effect against `base` at the same policy."""
    table = summarise(rows, dataset)
    if not table:
        return [f"No finished {dataset} runs yet."]
    variants = {v for v, _ in table}
    has_ref = reference in variants

    def ref_of(s: Summary) -> Summary | None:
        """The reference row of `s`'s budget (own depth policy), or None (none trained, or `s` is it)."""
        name = same_budget(reference, s.variant, variants)
        return None if name is None or name == s.variant else table.get((name, "adaptive"))

    def gap(s: Summary) -> list[float]:
        r = ref_of(s)
        return s.paired(r, train_length) if r is not None else []

    multiple = longest // train_length
    lines = [f"| variant | depth policy | seeds | ppl at 1× ({train_length}) | ppl at {multiple}× ({longest}) | "
             f"ppl {multiple}× / 1× | vs {reference} at 1× (paired; budget rows: their budget's) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    order = sorted(table, key=lambda k: (k[0] != reference, not k[0].startswith(("regular", "rg")), k[0], k[1]))
    for key in order:
        s = table[key]
        seeds = len(s.at(train_length))
        vs = _ms(gap(s), pct=True, digits=1) if ref_of(s) is not None else ""
        lines.append(f"| {s.variant} | {s.policy} | {seeds} | {_ms(s.at(train_length))} | {_ms(s.at(longest))} | "
                     f"{_ms(s.ratio(train_length, longest), digits=3)} | {vs} |")
    regular = [s for (v, _), s in table.items() if v.startswith(("regular", "rg"))]
    lines.append("")
    flat_ones = [s for s in regular if s.ratio(train_length, longest)
                 and float(np.mean(s.ratio(train_length, longest))) <= flat]
    lines.append(f"- **(a) Flat to {multiple}×** (mean ppl({longest}) / ppl({train_length}) ≤ {flat:.2f}): " + (
        ", ".join(f"{s.variant} / {s.policy} ({float(np.mean(s.ratio(train_length, longest))):.3f})"
                  for s in sorted(flat_ones, key=lambda s: float(np.mean(s.ratio(train_length, longest)))))
        if flat_ones else "no RegularGPT variant."))
    if has_ref:
        near = [s for s in regular if gap(s) and float(np.mean(gap(s))) <= close]
        gaps = sorted(regular, key=lambda s: float(np.mean(gap(s) or [np.inf])))
        best = gaps[0] if gaps and gap(gaps[0]) else None
        lines.append(f"- **(b) Within {close:.0%} of {reference} at 1×** (each at its own training budget): " + (
            ", ".join(f"{s.variant} / {s.policy} ({_ms(gap(s), pct=True, digits=1)})" for s in near)
            if near else "no RegularGPT variant" + (
                f"; the closest is {best.variant} / {best.policy} at "
                f"{_ms(gap(best), pct=True, digits=1)}" if best else "") + "."))
        both = [s for s in flat_ones if s in near]
        lines.append("- **Both at once**: " + (", ".join(f"{s.variant} / {s.policy}" for s in both) if both
                                               else "none."))
    base_rows = {p: s for (v, p), s in table.items() if v == base}
    effects = []
    for (v, p), s in sorted(table.items()):
        own_base = same_budget(base, v, variants)  # a budget row's knob is read against its budget's base
        if own_base is None or v == own_base or not v.startswith(("regular", "rg")) or (own_base, p) not in table:
            continue
        b = table[(own_base, p)]
        label = v if own_base == base else f"{v} (vs {own_base})"
        effects.append(f"| {label} | {p} | {_ms(s.paired(b, train_length), pct=True, digits=1)} | "
                       f"{_ms(s.paired(b, longest), pct=True, digits=1)} |")
    for p in sorted(base_rows):
        if p == "adaptive":
            continue
        b, own = base_rows[p], base_rows.get("adaptive")
        if own is not None:
            effects.append(f"| {base} (depth policy alone) | {p} vs adaptive | {_ms(b.paired(own, train_length), True, 1)} "
                           f"| {_ms(b.paired(own, longest), True, 1)} |")
    if effects:
        lines += ["", f"Each knob against `{base}` (the paper's settings), paired by seed (change of ppl, mean ± std "
                      "over seeds; negative = better):", "",
                  f"| variant | depth policy | Δppl at 1× | Δppl at {multiple}× |", "|---|---|---:|---:|", *effects]
    return lines
