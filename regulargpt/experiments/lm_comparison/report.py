"""A study's README: provenance, what was found (computed from the result files), setup, the parameter and speed
table, the perplexity tables and the discussion. Every number is read from the runs and result files."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from regulargpt.config import load_config
from regulargpt.evaluation.lm_findings import findings_markdown, position_gaps
from regulargpt.evaluation.lm_report import aggregate, load_rows, markdown_table
from regulargpt.evaluation.perplexity import model_label
from regulargpt.experiments.lm_comparison.plans import ROOT, V4, VOCAB, Plan, rel_path, train_overrides
from regulargpt.experiments.lm_comparison.stages import children_cpu, done, training_records
from regulargpt.experiments.lm_comparison.v3_report import v3_sections
from regulargpt.experiments.lm_comparison.v4_report import v4_sections
from regulargpt.files import atomic_write_text
from regulargpt.model import adaptive_depth
from regulargpt.provenance import provenance, stamp_lines

__all__ = ["discussion", "write_readme"]


def _train_stats(plan: Plan) -> dict[str, dict[str, float]]:
    """model → mean training tokens/s and wall seconds over its finished runs, mean CPU seconds over the runs that
    recorded them (metrics.jsonl, wall.json; OUT/trainings.jsonl for a run whose folder is gone), and the counts."""
    acc: dict[str, list[tuple[float, float, float | None]]] = {}
    recorded = training_records(plan)
    for dataset, variant, seed in plan.trainings():
        run_dir = plan.run_dir(dataset, variant, seed)
        model = variant.name
        try:
            last = json.loads((run_dir / "metrics.jsonl").read_text().strip().splitlines()[-1])
            wall = json.loads((run_dir / "wall.json").read_text())
        except (OSError, IndexError, json.JSONDecodeError):
            record = recorded.get(rel_path(run_dir))  # the run folder is gone: its committed timing, if any
            if record is not None:
                acc.setdefault(model, []).append((record["tokens_per_s"], record["seconds"], record["cpu_seconds"]))
            continue
        acc.setdefault(model, []).append((last["tokens"] / max(last["elapsed_s"], 1e-9), wall["seconds"],
                                          wall.get("cpu_seconds")))
    out = {}
    for m, v in acc.items():
        cpus = [c for _, _, c in v if c is not None]
        out[m] = {"tokens_per_s": sum(a for a, _, _ in v) / len(v), "wall_s": sum(b for _, b, _ in v) / len(v),
                  "cpu_s": sum(cpus) / len(cpus) if cpus else math.nan, "cpu_runs": len(cpus), "runs": len(v)}
    return out


def _findings(group: dict, chunk_size: int) -> list[str]:
    """Sentences computed from one dataset's table: ranks at 1× and at the longest length, who beats RegularGPT and
    whether the gap is larger than the spread over seeds (max − min of either model, when both have 2+ seeds)."""
    lengths = group["lengths"]
    train = min((t for t in group["train_length"] if t), default=lengths[0])

    def mean(m: str, L: int) -> float | None:
        v = group["cells"].get((m, L))
        return sum(v) / len(v) if v else None

    def spread(m: str, L: int) -> float | None:
        v = group["cells"].get((m, L), [])
        return max(v) - min(v) if len(v) > 1 else None

    rg = next((m for m in group["models"] if m.startswith("RegularGPT")), None)
    out = []
    if rg:
        best = [L for L in lengths if mean(rg, L) is not None
                and all(mean(m, L) is None or mean(m, L) >= mean(rg, L) for m in group["models"])]
        out.append(f"RegularGPT has the lowest mean perplexity at L = {', '.join(map(str, best))}." if best
                   else "RegularGPT does not have the lowest mean perplexity at any length.")
    for L in dict.fromkeys((lengths[0], lengths[-1])):
        ranked = sorted((mean(m, L), m) for m in group["models"] if mean(m, L) is not None)
        if not ranked:
            continue
        order = ", ".join(f"{m} {v:.2f}" for v, m in ranked)
        out.append(f"At L = {L} ({L / train:g}× the training length) the order is: {order}.")
        if rg and mean(rg, L) is not None:
            gaps = []
            for v, m in ranked:
                if v >= mean(rg, L):
                    continue
                noise = [x for x in (spread(rg, L), spread(m, L)) if x is not None]
                flag = " (within the seed spread)" if noise and mean(rg, L) - v < max(noise) else ""
                gaps.append(f"{m} by {(mean(rg, L) / v - 1) * 100:.1f}%{flag}")
            if gaps:
                out.append(f"RegularGPT loses at L = {L} to " + ", ".join(gaps) + " (relative ppl).")
    if rg:
        by_depth: dict[int, list[int]] = {}
        for L in lengths:
            if mean(rg, L) is not None:
                by_depth.setdefault(adaptive_depth(L, chunk_size), []).append(L)
        if len(by_depth) > 1:
            out.append(f"RegularGPT perplexity by adaptive depth ceil(log_{chunk_size} L): " + "; ".join(
                f"{d} steps (L = {', '.join(map(str, ls))}) {sum(mean(rg, L) for L in ls) / len(ls):.2f}"
                for d, ls in sorted(by_depth.items())) + ".")
    growth = [(mean(m, lengths[-1]) / mean(m, lengths[0]), m) for m in group["models"]
              if mean(m, lengths[0]) and mean(m, lengths[-1])]
    if growth and len(lengths) > 1:
        out.append(f"Perplexity at L = {lengths[-1]} relative to L = {lengths[0]} (lower = better extrapolation): "
                   + ", ".join(f"{m} {g:.2f}×" for g, m in sorted(growth)) + ".")
    return out


def _what_we_found(plan: Plan) -> list[str]:
    """Per dataset: every (variant, depth policy) at 1× and the longest length, the study's two questions answered,
    and each knob's paired effect (regulargpt.evaluation.lm_findings), from the nonoverlapping results."""
    lines = [f"Variants (`{rel_path(plan.out)}/runs/<dataset>/<variant>-seed<k>`): "
             + "; ".join(f"**{m.name}** = `configs/tiny/{m.config}.json`"
                         + (" with " + ", ".join(f"`{x}`" for x in m.sets) if m.sets else "")
                         + (f" (scored also with depth policies {', '.join(m.depth_policies)})" if m.depth_policies
                            else "")
                         + (f" (trained on {', '.join(m.datasets)} only)" if m.datasets else "")
                         for m in plan.models) + ".", ""]
    for dataset in plan.datasets:
        path = plan.out / dataset / "results.jsonl"
        lines += [f"### {dataset}", ""]
        if not path.is_file():
            lines += ["not evaluated yet", ""]
            continue
        rows = load_rows(path)
        lines += findings_markdown(rows, dataset, plan.train_length, plan.lengths[-1])
        gaps = position_gaps(rows, dataset, plan.train_length)
        if gaps:
            lines += ["", "Where in the window each variant loses at 1×: mean NLL minus ALiBi's by window position "
                          "(nats, paired by seed; > 0 = worse; a budget row against its budget's ALiBi, column vs):",
                      "", *gaps]
        lines.append("")
    return lines


def _summary(plan: Plan) -> list[str]:
    """One computed line per dataset: RegularGPT's rank at 1× and at the longest length, and its growth vs the best."""
    out = []
    for dataset in plan.datasets:
        path = plan.out / dataset / "results.jsonl"
        if not path.is_file():
            continue
        for (ds, _, _), g in aggregate(load_rows(path)).items():
            mean = {(m, L): sum(v) / len(v) for (m, L), v in g["cells"].items()}
            rg = next((m for m in g["models"] if m.startswith("RegularGPT")), None)
            first, last = g["lengths"][0], g["lengths"][-1]
            if rg is None or (rg, first) not in mean or (rg, last) not in mean:
                continue

            def rank(L: int, rg: str = rg, mean: dict = mean) -> str:
                values = sorted(v for (m, x), v in mean.items() if x == L)
                return f"{values.index(mean[(rg, L)]) + 1}/{len(values)}"

            growth = {m: mean[(m, last)] / mean[(m, first)] for m in g["models"]
                      if (m, first) in mean and (m, last) in mean}
            best = min(growth, key=growth.get)
            out.append(f"- **{ds}**: RegularGPT ranks {rank(first)} at L = {first} and {rank(last)} at L = {last} "
                       f"(1 = lowest perplexity); its perplexity changes {growth[rg]:.2f}× from L = {first} to "
                       f"{last} (flattest: {best} {growth[best]:.2f}×).")
    return out or ["(no results yet)"]


def write_readme(plan: Plan, counts: dict[str, int], command: str, failed: list[str], started: float | None,
                 cpu_started: float = 0.0) -> None:
    """OUT/README.md from the plan's files; with `started` (time.time() at the plan's start) also OUT/invocation.json:
    wall minutes since then and the CPU minutes of the child processes finished since ``children_cpu()`` read
    `cpu_started` (a staged study's follow-up plan runs in the same process, after the first plan's children)."""
    prov = provenance(command)
    stats = _train_stats(plan)
    lines = [
        "# Length extrapolation at CPU scale: RegularGPT vs ALiBi, T5, KERPLE, RoPE, NoPE", "",
        *([f"> **Superseded** by [{plan.superseded_by}](../{Path(plan.superseded_by).relative_to('results')}) "
           "(4× the training tokens, rows keyed by run variant, the RegularGPT knob ablation). Kept for reference; "
           "its rows merge runs by model name only.", ""] if plan.superseded_by else []),
        *stamp_lines(prov),
    ]
    invocation = plan.out / "invocation.json"
    if started is not None:
        atomic_write_text(invocation, json.dumps({"date": prov["date"], "command": prov["command"],
                                                  "wall_min": round((time.time() - started) / 60, 1),
                                                  "cpu_min": round((children_cpu() - cpu_started) / 60, 1)}) + "\n")
    if invocation.is_file():
        last = json.loads(invocation.read_text())
        lines.append(f"- Last full invocation (`{last['command']}`, {last['date']}): {last['wall_min']} min wall, "
                     f"{last['cpu_min']} min CPU in its child processes (data check, training, evaluation)")
    runs = sum(int(s["runs"]) for s in stats.values())
    if runs:
        wall = sum(s["wall_s"] * s["runs"] for s in stats.values()) / 60
        cpu_runs = sum(int(s["cpu_runs"]) for s in stats.values())
        cpu = sum(s["cpu_s"] * s["cpu_runs"] for s in stats.values() if s["cpu_runs"]) / 60
        finished = sum(done(plan, *r) for r in plan.trainings())
        untimed = (f" ({finished - runs} further finished runs predate `trainings.jsonl` and their folders are gone: "
                   "their timings are in this README's git history)" if finished > runs else "")
        lines.append(f"- Training: {runs} runs, {wall:.1f} min wall in total; {cpu:.1f} min CPU over the {cpu_runs} "
                     f"runs that recorded it (OMP_NUM_THREADS=1 per run; on a shared machine wall exceeds CPU)"
                     + untimed)
    scoring = sum(r.get("seconds", 0.0) for d in plan.datasets if (plan.out / d / "results.jsonl").is_file()
                  for r in load_rows(plan.out / d / "results.jsonl"))
    if scoring:
        lines.append(f"- Evaluation: {scoring / 60:.1f} min wall of scoring in total (the `seconds` of every row)")
    rg = load_config(ROOT / "configs" / "tiny" / "regular_gpt.json").model
    dense = load_config(ROOT / "configs" / "tiny" / "alibi.json").model
    overrides = " ".join("--set " + o for o in train_overrides(plan, "<dataset>", 0)).replace("seed=0", "seed=<k>")
    seeds = plan.seed_summary()
    lines += ["", "## What we found" if plan.is_ablation else "## Summary", ""]
    lines += _what_we_found(plan) if plan.is_ablation else _summary(plan)
    lines += v4_sections(plan) if plan is V4 else v3_sections(plan)  # a staged study's stages and answers
    lines += [
        "", "## Setup", "",
        (f"- Data: {', '.join(plan.datasets)}, each built with `python data_prep/prepare.py --source <dataset> "
         f"--out {rel_path(plan.data_root)}/<dataset> --vocab-size {VOCAB} --max-bytes {plan.max_bytes} --num-proc 1` "
         f"(its own {VOCAB}-piece BPE tokenizer per dataset; document-level train/val/test split)."),
        (f"- Models: `configs/tiny/<model>.json`: d_model {rg.d_model}, {rg.n_heads} heads, FFN ×{rg.ffn_mult}, "
         f"{rg.norm}-LN, {rg.activation.upper()}, {'tied' if rg.tie_embeddings else 'untied'} embeddings; the baselines have "
         f"{dense.n_layers} dense causal layers, RegularGPT one shared block of K = {rg.thickness} sub-layers "
         f"(chunk size C = {rg.chunk_size}) applied at ceil(log_C T) depth steps. Overrides of every run: "
         f"`{overrides}`."),
        (f"- Training: {plan.steps} steps × batch {plan.batch_size} × length {plan.train_length} = "
         f"**{plan.train_tokens:,} tokens per run**, "
         + ("identical for every model" if not any(m.steps for m in plan.models) else
            "for every row but the training-budget rows: " + ", ".join(
                f"{m.name} {plan.steps_of(m)} steps = {plan.tokens_of(m):,}" for m in plan.models if m.steps))
         + f"; seeds: {seeds}."),
        (f"- Evaluation: `eval/extrapolate.py`, non-overlapping windows (the KERPLE/ALiBi protocol) on the test "
         f"split at L = {', '.join(map(str, plan.lengths))} (1× … {plan.multiples}×), the same {plan.eval_tokens:,} "
         f"tokens scored at every length; the exact command is at the top of each `<dataset>/table.md`."),
        "", "| model | label | parameters | vs RegularGPT | train tokens/s (1 thread, wall) | wall / CPU s per run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    reference = counts.get("regular_gpt", next(iter(counts.values())))
    for variant in plan.models:
        model, n = variant.name, counts[variant.name]
        label = model_label(load_config(ROOT / "configs" / "tiny" / f"{variant.config}.json", list(variant.sets)).model)
        label += "".join(f" {item.split('.', 1)[1]}" for item in variant.sets)
        s = stats.get(model)
        speed = f"{s['tokens_per_s']:,.0f}" if s else "—"
        wall = f"{s['wall_s']:.0f} / " + ("—" if math.isnan(s["cpu_s"]) else f"{s['cpu_s']:.0f}") if s else "—"
        if s and 0 < s["cpu_runs"] < s["runs"]:
            wall += f" (CPU of {s['cpu_runs']} of {s['runs']} runs)"
        lines.append(f"| {model} | {label} | {n:,} | {(n / reference - 1) * 100:+.2f}% | {speed} | {wall} |")
    if failed:
        lines += ["", f"**Failed trainings (not in the tables):** {', '.join(failed)}."]
    lines += ["", "## Results", ""]
    for dataset in plan.datasets:
        path = plan.out / dataset / "results.jsonl"
        if not path.is_file():
            lines += [f"### {dataset}", "", "not evaluated yet", ""]
            continue
        for (ds, split, protocol), group in aggregate(load_rows(path)).items():
            plots = (f"Plots: [{ds}/ppl_vs_length.png]({ds}/ppl_vs_length.png), "
                     f"[{ds}/loss_vs_position.png]({ds}/loss_vs_position.png).")
            lines += [f"### {ds} ({split} split, {protocol})", "", markdown_table(group), "", plots, ""]
            if not plan.is_ablation:  # v1's per-table sentences assume one RegularGPT row
                lines += [f"- {s}" for s in _findings(group, rg.chunk_size)] + [""]
    lines += ["## Discussion", "", discussion(plan, stats)]
    atomic_write_text(plan.out / "README.md", "\n".join(lines).rstrip() + "\n")
    print(f"wrote {rel_path(plan.out / 'README.md')}", flush=True)


def discussion(plan: Plan, stats: dict[str, dict[str, float]]) -> str:
    """How to read the findings; the structural numbers come from the RegularGPT config and the measured speeds."""
    cfg = load_config(ROOT / "configs" / "tiny" / "regular_gpt.json").model
    c, k, longest = cfg.chunk_size, cfg.thickness, plan.lengths[-1]
    d_train, d_long = adaptive_depth(plan.train_length, c), adaptive_depth(longest, c)
    baseline = load_config(ROOT / "configs" / "tiny" / "alibi.json").model.n_layers
    speeds = [s["tokens_per_s"] for m, s in stats.items() if m != "regular_gpt"]
    seeds = plan.seed_summary()
    measured = (f"; measured: {sum(speeds) / len(speeds) / stats['regular_gpt']['tokens_per_s']:.1f}× slower "
                f"per token" if speeds and "regular_gpt" in stats else "")
    return f"""\
The bullet points under each table are computed from the result files; this section says how to read them.

- **Scale.** These are ~1.3M-parameter models trained on {plan.train_tokens:,} tokens each: far from converged, so
  differences at 1× mostly measure how fast each architecture learns, not its capacity. Seeds:
  {seeds}; a gap marked "within the seed spread" is not significant, and single-seed gaps of a few percent are not
  either.
- **Compute is not matched.** At equal tokens and parameters RegularGPT (C = {c}, K = {k}) applies its {k} shared
  sub-layers at ceil(log_{c} {plan.train_length}) = {d_train} depth steps in training ({k * d_train} layer applications
  against the baselines' {baseline}{measured}). At L = {longest} it applies {d_long} depth steps ({k * d_long}
  applications): {d_long - d_train} more than it ever ran in training, at dilations up to {c}^{d_long - 1} = {c ** (d_long - 1)}.
- **Why RegularGPT can trail a recency-biased baseline.** Each depth step sees exactly C keys at dilation C^l; past
  the training length the new, coarser steps mix in states from far away that the shared weights were never trained
  to read. ALiBi and KERPLE decay attention with distance, which acts as a *local window*: far context is ignored and
  perplexity stays flat. The RegularGPT paper's abstract reports that on natural language RegularGPT "rediscovers the
  local windowed attention effect deemed necessary in prior work for length extrapolation": it extrapolates when its
  learned window scalars and pad states make the extra depth steps behave like near-identity updates. With a budget
  this small that behaviour may or may not have been learned; `loss_vs_position.png` shows whether its loss rises at
  window positions past the training length (a break) or stays flat (windowed behaviour).
- **Depth steps.** The "by adaptive depth" line under each table groups RegularGPT's perplexity by the number of
  depth steps it runs at each length. Flat within a depth and a rise whenever a step is added means the break comes
  from the extra steps, not from the amount of context.
- **NoPE and RoPE** have no recency bias; a rise past the training length is their expected failure (the control).
"""
