"""The v3 study's own README sections (issues 25, 28 and 51), computed from its result rows: the stages and how far
they got, the gap to ALiBi at equal parameters and at equal compute, the gap as training grows (table, fit, plots),
RegularGPT under ``depth_policy=train`` against the 64-token windows, the receptive fields, and the position
encodings of 2023 with their passkey accuracy. The rest of the README is v2's (:mod:`.report`)."""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from regulargpt.evaluation.lm_findings import Summary, run_name, summarise
from regulargpt.evaluation.lm_report import latest_rows, load_rows
from regulargpt.evaluation.lm_trends import budget_markdown, gap_table, plot_gap_vs_tokens, plot_ppl_by_budget
from regulargpt.evaluation.retrieval_probes import DISTRACTORS, effective_length
from regulargpt.experiments.lm_comparison.estimate import estimate_table
from regulargpt.experiments.lm_comparison.plans import (
    STUDIES,
    V3_BUDGET_MODELS,
    V3_EQUAL_COMPUTE,
    V3_POSITIONS,
    V3_WINDOWS,
    Plan,
    rel_path,
)
from regulargpt.experiments.lm_comparison.stages import receptive_field_dir

__all__ = ["Gap", "budget_suffixes", "passkey_by_length", "stages_and_rows", "v3_sections"]

_RG = ("regular_gpt", "rg_c8")


class Gap(NamedTuple):
    """Paired gaps of a row to a reference at one length, in %: their mean, seed count and range."""
    mean: float
    n: int
    lo: float
    hi: float

    @property
    def spread(self) -> str:
        """The per-seed range when there are several seeds, e.g. "n=2, seeds +37.0 … +41.8%"; "n=1" otherwise."""
        return f"n={self.n}, seeds {self.lo:+.1f} … {self.hi:+.1f}%" if self.n > 1 else "n=1"


def _mean_gap(table: dict[tuple[str, str], Summary], row: tuple[str, str], ref: tuple[str, str],
              length: int) -> Gap | None:
    """ppl_row / ppl_ref − 1 (in %) over the seeds both have. Worked example: seeds 0 and 1 with ppl 60, 66 against
    50, 50 give Gap(mean=26.0, n=2, lo=20.0, hi=32.0)."""
    if row not in table or ref not in table:
        return None
    gaps = [100 * g for g in table[row].paired(table[ref], length)]
    return Gap(float(np.mean(gaps)), len(gaps), min(gaps), max(gaps)) if gaps else None


def _noise(table: dict[tuple[str, str], Summary], row: tuple[str, str], ref: tuple[str, str], length: int) -> str:
    """" (within the seed spread)" when the paired gaps' sample std exceeds their mean's size, else ""."""
    gaps = table[row].paired(table[ref], length)
    return " (within the seed spread)" if len(gaps) > 1 and float(np.std(gaps, ddof=1)) > abs(float(np.mean(gaps))) \
        else ""


def _equal_compute(table: dict[tuple[str, str], Summary], t: int, longest: int) -> list[str]:
    lines = ["### Equal parameters or equal compute", "",
             "RegularGPT applies its K = 4 shared sub-layers at 3 depth steps at T = 64: 12 layer applications per "
             "token against a 4-layer baseline's 4 (equal parameters); the `_l12` rows have 12 dense layers (equal "
             "layer applications, ~2.2× the parameters). Paired gaps (ppl / ppl_ref − 1; > 0 = the row is worse):", ""]
    rows = [(m, p) for m in _RG for p in ("adaptive", "train")]
    refs = [(m, "adaptive") for pair in V3_EQUAL_COMPUTE.items() for m in pair]
    lines += gap_table(table, rows, refs, [t, longest], t) or ["(no results yet)"]
    lines.append("")
    for rg in _RG:
        params = _mean_gap(table, (rg, "adaptive"), ("alibi", "adaptive"), t)
        compute = _mean_gap(table, (rg, "adaptive"), (V3_EQUAL_COMPUTE["alibi"], "adaptive"), t)
        if params and compute:
            word = "larger" if compute.mean > params.mean else "smaller"
            lines.append(f"- **{rg}** at 1×: {params.mean:+.1f}% to ALiBi at equal parameters ({params.spread}), "
                         f"{compute.mean:+.1f}% to ALiBi-12 at equal compute ({compute.spread}): the gap is {word} at "
                         f"equal compute by {abs(compute.mean - params.mean):.1f} points.")
    for small, big in V3_EQUAL_COMPUTE.items():
        gain = _mean_gap(table, (big, "adaptive"), (small, "adaptive"), t)
        if gain:
            lines.append(f"- **{big}** vs **{small}** at 1×: {gain.mean:+.1f}% ({gain.spread}): what 12 layers buy the "
                         f"baseline at this budget.")
    return lines


def budget_suffixes(plan: Plan) -> dict[int, str]:
    """Training tokens → the suffix of that budget's row names: "" for the plan's own steps, and e.g. "_s400" for
    rows named <model>_s400 (a model of V3_BUDGET_MODELS) that set their own steps."""
    out = {plan.train_tokens: ""}
    for m in plan.models:
        base = next((b for b in V3_BUDGET_MODELS if m.steps and m.name.startswith(b + "_")), None)
        if base is not None:
            out[plan.tokens_of(m)] = m.name[len(base):]
    return out


def _budgets(plan: Plan, table: dict[tuple[str, str], Summary], t: int, longest: int) -> list[str]:
    tokens = budget_suffixes(plan)
    predict_at = 10 * plan.train_tokens
    lines = ["### As training grows", "",
             f"RegularGPT (C = 4, the paper's settings; C = 8, v2's best) against ALiBi at "
             f"{', '.join(f'{n:,}' for n in sorted(tokens))} training tokens; the fit predicts at 10× v2's "
             f"{plan.train_tokens:,} tokens. Plots: [gap_vs_tokens.png](gap_vs_tokens.png), "
             f"[ppl_vs_length_by_budget.png](ppl_vs_length_by_budget.png).", ""]
    lines += budget_markdown(table, tokens, _RG, "alibi", t, longest, predict_at)
    flat = []
    for n, suffix in sorted(tokens.items()):
        ratios = [(m, float(np.mean(table[(m + suffix, "train")].ratio(t, longest))))
                  for m in _RG if (m + suffix, "train") in table and table[(m + suffix, "train")].ratio(t, longest)]
        if ratios:
            flat.append(f"{n:,} tokens: " + ", ".join(f"{m} {r:.3f}{'' if r <= 1.0 else ' (NOT flat)'}"
                                                      for m, r in ratios))
    if flat:
        lines.append(f"- **Depth `train` flat to {longest // t}×** (mean ppl({longest}) / ppl({t}) ≤ 1.00) at every "
                     "budget? " + "; ".join(flat) + ".")
    plot_gap_vs_tokens(table, tokens, _RG, "alibi", t, predict_at, plan.out / "gap_vs_tokens.png")
    plot_ppl_by_budget(table, tokens, [*_RG, "alibi"], plan.lengths, plan.out / "ppl_vs_length_by_budget.png")
    return lines


def _windows(plan: Plan, table: dict[tuple[str, str], Summary], t: int, longest: int) -> list[str]:
    lines = ["### RegularGPT under `depth_policy=train` against a 64-token window", "",
             f"Under `train` the depth is fixed at L_train = ceil(log_C {t}), so the reach is too: each of the K "
             f"sub-layers of depth step l reads C keys C^l apart, so the last prediction reads the last "
             f"K·(C^L_train − 1) + 1 tokens (253 for C = 4 and C = 8 with K = 4 at T = {t}; {t} with K = 1) and "
             "nothing older (tests/test_regular_gpt_knobs.py). The windowed baselines "
             "(`model.window=64`, NoPE and RoPE, 4 layers = equal parameters, 12 = equal layer applications) see "
             "the last 64 keys per layer (the last prediction reaches n_layers·63 + 1 tokens back); at W = T_train "
             "they train exactly as the unwindowed models. Paired gaps of the row to each window (> 0 = the row is "
             "worse):", ""]
    rows = [(m, "train") for m in _RG] + [("alibi", "adaptive")]
    lines += gap_table(table, rows, [(w, "adaptive") for w in V3_WINDOWS], [t, longest], t) or ["(no results yet)"]
    lines.append("")
    for rg in _RG:
        for w in V3_WINDOWS[:2]:  # the equal-parameter windows
            gaps = [(L, _mean_gap(table, (rg, "train"), (w, "adaptive"), L)) for L in (t, longest)]
            said = [f"{'worse' if g.mean > 0 else 'better'} by {abs(g.mean):.1f}% at {L // t}× ({g.spread})"
                    + _noise(table, (rg, "train"), (w, "adaptive"), L) for L, g in gaps if g]
            if said:
                lines.append(f"- **{rg} (train) vs {w}**: " + ", ".join(said) + ".")
    for w in V3_WINDOWS:
        beat = _mean_gap(table, ("alibi", "adaptive"), (w, "adaptive"), t)
        if beat:
            lines.append(f"- **ALiBi vs {w} at 1×**: {beat.mean:+.1f}% ({beat.spread}): ALiBi "
                         f"{'beats' if beat.mean < 0 else 'does not beat'} the window"
                         f"{_noise(table, ('alibi', 'adaptive'), (w, 'adaptive'), t)}.")
    for w in V3_WINDOWS:
        if (w, "adaptive") in table and table[(w, "adaptive")].ratio(t, longest):
            lines.append(f"- **{w}**: ppl {longest // t}× / 1× = "
                         f"{float(np.mean(table[(w, 'adaptive')].ratio(t, longest))):.3f} "
                         f"(n={len(table[(w, 'adaptive')].ratio(t, longest))}).")
    found = [(name, policy, receptive_field_dir(plan, name, policy) / "receptive_field.json")
             for name, policy in plan.receptive_fields]
    found = [(n, p, json.loads(f.read_text())) for n, p, f in found if f.is_file()]
    if found:
        lines += ["", f"Receptive fields (`eval/receptive_field.py`, seed 0, {plan.receptive_field_length} tokens, 32 "
                      "test windows): the fewest most-recent tokens holding 50 / 90 / 99% of the last prediction's "
                      "normalised input gradient.", "", "| row | depth policy | 50% | 90% | 99% | files |",
                  "|---|---|---:|---:|---:|---|"]
        for name, policy, summary in found:
            reach = summary["tokens_holding_mass"]
            where = rel_path(receptive_field_dir(plan, name, policy)).removeprefix(rel_path(plan.out) + "/")
            lines.append(f"| {name} | {policy or 'own'} | {reach['50%']} | {reach['90%']} | {reach['99%']} | "
                         f"[{where}]({where}/receptive_field.png) |")
    return lines


def passkey_by_length(plan: Plan, probe: str = "passkey") -> dict[str, dict[int, float]]:
    """Row name → length → probe accuracy (mean over depths, then over the seeds probed) from the latest probe rows
    of the plan's first dataset; a row probed under an evaluation-time RoPE scaling is named
    ``<variant>+<rope_type>`` (as its perplexity row); {} without a results file."""
    path = plan.out / plan.datasets[0] / "results.jsonl"
    acc: dict[str, dict[int, list[float]]] = {}
    for row in latest_rows(load_rows(path)) if path.is_file() else []:
        named = run_name(row["run"])
        if row.get("probe") == probe and named and row["dataset"] == plan.datasets[0]:
            scaled = f"+{json.loads(row['rope_scaling'])['rope_type']}" if row.get("rope_scaling") else ""
            acc.setdefault(named[0] + scaled, {}).setdefault(row["length"], []).append(row["accuracy"])
    return {v: {L: float(np.mean(a)) for L, a in sorted(by.items())} for v, by in acc.items()}


def _positions(plan: Plan, table: dict[tuple[str, str], Summary], t: int, longest: int,
               threshold: float = 0.9) -> list[str]:
    """The position encodings of 2023 beside ALiBi, RegularGPT and the RoPE window: ppl at 1× and at the longest
    length, their ratio, the paired gaps to ALiBi, and passkey accuracy by length with the effective length."""
    by_name = {m.name: m for m in plan.models}
    rows = [(n, "adaptive") for n in V3_POSITIONS if n in by_name]
    rows += [(f"{n}+{s.rope_type}", "adaptive") for n in V3_POSITIONS if n in by_name for s in by_name[n].rope_scalings]
    rows += [("alibi", "adaptive"), ("regular_gpt", "adaptive"), ("regular_gpt", "train"), ("rope_w64", "adaptive")]
    rows = [r for r in rows if r in table]
    if not any(n.split("+")[0] in V3_POSITIONS for n, _ in rows):
        return []
    passkey = passkey_by_length(plan)
    lengths = sorted({L for acc in passkey.values() for L in acc})
    scalings = "; ".join(f"**{n}+{s.rope_type}** = {n}'s weights scored with `--rope-scaling '{s.key}'`"
                         for n in V3_POSITIONS if n in by_name for s in by_name[n].rope_scalings)
    lines = ["### The position encodings of 2023 (`positions-2023`)", "",
             f"FIRE, xPos, Sandwich and plain (unwindowed) RoPE, {plan.steps_of(by_name[rows[0][0]])} steps as "
             f"every 1.2M-token row, 4 layers (matched on parameters), seed 0; {scalings} (no training at the longer "
             "length). ALiBi, RegularGPT and the RoPE window for reference, mean over their seeds; gaps to ALiBi are "
             f"paired by seed (> 0 = worse). Passkey: `eval/extrapolate.py --probe passkey` ({plan.probe_trials} "
             f"trials at each of 5 depths per length): the true 5-digit key ranked by log-likelihood against "
             f"{DISTRACTORS} random keys (chance {1 / (1 + DISTRACTORS):.2f}); effective length = the longest length "
             f"with accuracy ≥ {threshold:g} there and at every shorter one; — = not probed (the reference runs' "
             "folders are gone).", "",
             f"| row | depth policy | seeds | ppl {t} | ppl {longest} | {longest // t}× / 1× | vs alibi at 1× | "
             f"vs alibi at {longest // t}× | " + "".join(f"passkey {L} | " for L in lengths) + "effective length |",
             "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(lengths) + 1)]
    for name, policy in rows:
        summary = table[(name, policy)]
        ppl = [f"{float(np.mean(summary.at(L))):.2f}" if summary.at(L) else "—" for L in (t, longest)]
        ratio = summary.ratio(t, longest)
        gaps = [_mean_gap(table, (name, policy), ("alibi", "adaptive"), L) for L in (t, longest)]
        gap = ["—" if name == "alibi" or g is None else f"{g.mean:+.1f}%" for g in gaps]
        acc = passkey.get(name, {})
        eff = effective_length(acc, threshold) if acc else None
        lines.append(f"| {name} | {policy} | {len(summary.at(t))} | {' | '.join(ppl)} | "
                     + (f"{float(np.mean(ratio)):.3f}" if ratio else "—") + f" | {' | '.join(gap)} | "
                     + "".join(f"{acc[L]:.2f} | " if L in acc else "— | " for L in lengths)
                     + ("—" if not acc else str(eff) if eff is not None else f"< {min(acc)}") + " |")
    return lines


def stages_and_rows(plan: Plan, study: str, plans: list[Plan]) -> tuple[list[str], dict[tuple[str, str], Summary] | None]:
    """A staged study's "## Stages" section (the estimate table of `plans`) and its "## What <study> asks" heading,
    with the summarised rows of the plan's first dataset; None (and "not evaluated yet") before any row."""
    lines = ["## Stages", "", "Trainings run stage by stage (rerun the command to resume); estimated CPU minutes from "
             f"the recorded timings of finished studies (`python eval/lm_comparison.py --study {study} --estimate`):",
             "", estimate_table(plans), "", f"## What {study} asks", ""]
    path = plan.out / plan.datasets[0] / "results.jsonl"
    if not path.is_file():
        return [*lines, "not evaluated yet", ""], None
    return lines, summarise(load_rows(path), plan.datasets[0])


def v3_sections(plan: Plan) -> list[str]:
    """The staged study's sections of its README (empty for an unstaged plan)."""
    if not plan.stages:
        return []
    lines, table = stages_and_rows(plan, "v3", [plan, *(STUDIES[name] for name in plan.then)])
    if table is None:
        return lines
    t, longest = plan.train_length, plan.lengths[-1]
    lines += [*_equal_compute(table, t, longest), "", *_budgets(plan, table, t, longest), "",
              *_windows(plan, table, t, longest), ""]
    positions = _positions(plan, table, t, longest)
    lines += [*positions, ""] if positions else []
    for name in plan.then:
        other = STUDIES[name]
        lines += [f"### Longer training length (`--study {name}`)", "",
                  f"Trained at T = {other.train_length}, scored to {other.lengths[-1]}: "
                  f"[{rel_path(other.out)}/README.md](../{rel_path(other.out).removeprefix('results/')}/README.md)"
                  + ("" if (other.out / "README.md").is_file() else " (not run yet)") + ".", ""]
    return lines
