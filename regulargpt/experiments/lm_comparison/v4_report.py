"""The v4 study's README sections (issue 41), computed from its result rows and receptive fields: RegularGPT in the
paper's language-model regime (T = 256, C = 16 and 64, two depth steps) answers four questions:

(a) is it within 10% of ALiBi at 1×, at equal parameters (ALiBi-4) and at equal layer applications (ALiBi-8)?
(b) is it flat to 32× (mean ppl(8192) / ppl(256) ≤ 1.00) under depth `adaptive` or `train`?
(c) does its receptive field look like a local window (the paper's claim), and how wide?
(d) how does the gap to ALiBi move with C: C = 8 (v2-t256, the same data, steps and T) → 16 → 64?

Every answer quotes the per-seed range of its paired gaps (ppl / ppl_ALiBi − 1, paired by seed). The rest of the
README is the ablation report every study gets (:mod:`.report`)."""

from __future__ import annotations

import json

import numpy as np

from regulargpt.evaluation.lm_findings import Summary, summarise
from regulargpt.evaluation.lm_report import load_rows
from regulargpt.evaluation.lm_trends import gap_table
from regulargpt.experiments.lm_comparison.plans import STUDIES, V4_EQUAL_COMPUTE, Plan
from regulargpt.experiments.lm_comparison.stages import receptive_field_dir
from regulargpt.experiments.lm_comparison.v3_report import Gap, _mean_gap, stages_and_rows

__all__ = ["v4_sections"]

_RG = ("rg_c16", "rg_c64")
_CHUNK = {"rg_c8": 8, "rg_c16": 16, "rg_c64": 64}
_WINDOW = "rope_w64"
_POLICIES = ("adaptive", "train")


def _within(gap: Gap | None, limit: float = 10.0) -> str:
    if gap is None:
        return "not scored yet"
    verdict = "yes" if gap.mean <= limit else "no"
    return f"{verdict}: {gap.mean:+.1f}% ({gap.spread})"


def _answer_a(table: dict[tuple[str, str], Summary], t: int) -> list[str]:
    params, compute = "alibi", V4_EQUAL_COMPUTE["alibi"]
    lines = ["### (a) Within 10% of ALiBi at 1×?", "",
             f"At T = {t} both depth policies run ceil(log_C {t}) = 2 steps, so the 1× rows are the same model. "
             f"Equal parameters: **{params}** (4 layers); equal layer applications: **{compute}** (8 layers = K·L = "
             "4·2; ~1.6× the parameters).", ""]
    lines += gap_table(table, [(m, "adaptive") for m in _RG], [(params, "adaptive"), (compute, "adaptive")], [t], t) \
        or ["(no results yet)"]
    lines.append("")
    for rg in _RG:
        lines.append(f"- **{rg}**: vs {params} {_within(_mean_gap(table, (rg, 'adaptive'), (params, 'adaptive'), t))}"
                     f"; vs {compute} {_within(_mean_gap(table, (rg, 'adaptive'), (compute, 'adaptive'), t))}.")
    deeper = _mean_gap(table, (compute, "adaptive"), (params, "adaptive"), t)
    if deeper:
        lines.append(f"- **{compute} vs {params}** at 1×: {deeper.mean:+.1f}% ({deeper.spread}): what 8 layers buy "
                     "the baseline at this budget (> 0: the deeper model is behind, so \"equal layer applications\" "
                     "is the weaker reference here).")
    return lines


def _ratio(table: dict[tuple[str, str], Summary], key: tuple[str, str], t: int, longest: int) -> str | None:
    if key not in table or not table[key].ratio(t, longest):
        return None
    ratios = table[key].ratio(t, longest)
    spread = f", seeds {min(ratios):.3f} … {max(ratios):.3f}" if len(ratios) > 1 else ""
    flat = "flat" if float(np.mean(ratios)) <= 1.0 else "NOT flat"
    return f"{float(np.mean(ratios)):.3f} (n={len(ratios)}{spread}: {flat})"


def _answer_b(table: dict[tuple[str, str], Summary], t: int, longest: int) -> list[str]:
    lines = [f"### (b) Flat to {longest // t}×?", "",
             f"Mean ppl({longest}) / ppl({t}) over seeds; ≤ 1.00 is flat.", ""]
    for key in [(m, p) for m in _RG for p in _POLICIES] + [(m, "adaptive") for m in ("alibi", "alibi_l8", _WINDOW)]:
        said = _ratio(table, key, t, longest)
        if said:
            lines.append(f"- **{key[0]}** ({key[1]}): {said}")
    return lines


def _receptive(plan: Plan) -> dict[tuple[str, str], dict[str, int]]:
    """(row, policy or 'own') → {"50%": n, "90%": n, "99%": n} tokens holding that share of the gradient."""
    out = {}
    for name, policy in plan.receptive_fields:
        path = receptive_field_dir(plan, name, policy) / "receptive_field.json"
        if path.is_file():
            out[(name, policy or "own")] = json.loads(path.read_text())["tokens_holding_mass"]
    return out


def _answer_c(plan: Plan) -> list[str]:
    found = _receptive(plan)
    lines = ["### (c) A local window?", "",
             f"`eval/receptive_field.py`, seed 0, {plan.receptive_field_length} tokens, 32 test windows: the fewest "
             "most-recent tokens holding 50 / 90 / 99% of the last prediction's normalised input gradient. "
             f"Structural reach: {_WINDOW} reads 4·63 + 1 = 253 tokens; RegularGPT's first depth step reads the last "
             "C tokens, the second C keys C apart (under `train` the reach stops at K·(C² − 1) + 1).", ""]
    if not found:
        return [*lines, "(no receptive field yet)"]
    lines += ["| row | depth policy | 50% | 90% | 99% |", "|---|---|---:|---:|---:|"]
    lines += [f"| {n} | {p} | {r['50%']} | {r['90%']} | {r['99%']} |" for (n, p), r in found.items()]
    lines.append("")
    window = found.get((_WINDOW, "own"))
    for rg in _RG:
        for policy in ("own", "train"):
            reach = found.get((rg, policy))
            if reach is None:
                continue
            c = _CHUNK[rg]
            inside = "inside" if reach["90%"] <= c else "beyond"
            versus = (f"; the 64-key window's 90% lies within {window['90%']}" if window else "")
            lines.append(f"- **{rg}** ({policy}): 50% of the gradient within the last {reach['50%']} tokens, 90% "
                         f"within {reach['90%']} ({inside} its first step's {c}-token window), 99% within "
                         f"{reach['99%']}{versus}.")
    return lines


def _answer_d(plan: Plan, table: dict[tuple[str, str], Summary], t: int) -> list[str]:
    lines = ["### (d) Does the gap shrink as C grows?", "",
             f"Paired gap to ALiBi-4 at 1× (T = {t}) by chunk size; C = 8 is `--study v2-t256` (the same data, "
             "steps, batch and T; seed 0 only).", "", "| C | depth steps at T | row | seed-0 gap | mean gap (seeds) |",
             "|---:|---:|---|---:|---:|"]
    older = STUDIES["v2-t256"]
    path = older.out / older.datasets[0] / "results.jsonl"
    tables = {"rg_c8": summarise(load_rows(path), older.datasets[0]) if path.is_file() else {}}
    tables.update({rg: table for rg in _RG})
    for rg, c in _CHUNK.items():
        source = tables[rg]
        if (rg, "adaptive") not in source or ("alibi", "adaptive") not in source:
            continue
        gaps = [100 * g for g in source[(rg, "adaptive")].paired(source[("alibi", "adaptive")], t)]
        seed0 = source[(rg, "adaptive")].ppl.get(t, {}).get(0), source[("alibi", "adaptive")].ppl.get(t, {}).get(0)
        first = f"{100 * (seed0[0] / seed0[1] - 1):+.1f}%" if None not in seed0 else "—"
        steps = next(n for n in range(1, 10) if c ** n >= t)
        spread = f" (seeds {min(gaps):+.1f} … {max(gaps):+.1f})" if len(gaps) > 1 else ""
        lines.append(f"| {c} | {steps} | {rg} | {first} | {float(np.mean(gaps)):+.1f}%{spread} |")
    return lines


def v4_sections(plan: Plan) -> list[str]:
    """The v4 README's stages and its four answers."""
    lines, table = stages_and_rows(plan, "v4", [plan])
    if table is None:
        return lines
    t, longest = plan.train_length, plan.lengths[-1]
    return [*lines, *_answer_a(table, t), "", *_answer_b(table, t, longest), "", *_answer_c(plan), "",
            *_answer_d(plan, table, t), ""]
