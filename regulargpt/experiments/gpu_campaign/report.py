"""What the GPU campaign writes from its files: the corpus summary, the study's throughput table, the perplexity table
in the form of KERPLE's Table 3 (rows: models; columns: evaluation lengths) and the campaign's README.

The README is rebuilt from a campaign folder (what came back from the device, unpacked) by
`python eval/gpu_campaign.py report --from DIR --out results/gpu/<date>-campaign/README.md`; every figure in it is
read from a file of that folder.
"""
from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from regulargpt.evaluation.lm_report import latest_rows, load_rows

SPLIT_NAMES = {0: "train", 1: "val", 2: "test"}


def corpus_summary(data_dir: str | Path) -> list[str]:
    """Markdown lines: tokens, documents and packages of each split of a prepared python-packages folder.

    Every package's files are in one split (regulargpt/data/python_packages.py); the manifest's source.packages
    records which, and the table counts them per split.
    """
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    packages = manifest["source"].get("packages") or {}
    per_split: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES.values()}
    size: Counter = Counter()
    for name, info in sorted(packages.items()):
        split = SPLIT_NAMES[info["split"]]
        per_split[split].append(name)
        size[split] += info["bytes"]
    stats = manifest.get("stats", {})
    lines = [f"Source `{manifest['source']['spec']}`: {manifest['source']['files']:,} files, "
             f"{manifest['source']['bytes'] / 1e6:,.1f} MB, {len(packages)} packages; vocab {manifest['vocab_size']:,}; "
             f"{sum(s['tokens'] for s in manifest['splits'].values()):,} tokens in all; prepared in "
             f"{sum(stats.get('seconds', {}).values()):.1f} s on {stats.get('num_proc', '?')} processes.", "",
             "| split | tokens | documents | packages | .py bytes | chars/token | packages (largest first) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for split, info in manifest["splits"].items():
        names = sorted(per_split.get(split, []), key=lambda n: -packages[n]["bytes"])
        shown = ", ".join(names[:8]) + (f", … ({len(names) - 8} more)" if len(names) > 8 else "")
        lines.append(f"| {split} | {info['tokens']:,} | {info['documents']:,} | {len(names)} | {size[split]:,} | "
                     f"{stats.get('chars_per_token', {}).get(split, '–')} | {shown} |")
    skipped = manifest["source"].get("skipped") or {}
    if skipped:
        lines += ["", f"Skipped files: {skipped}"]
    return lines


def _metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def study_rows(study_dir: str | Path, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per planned model: steps and tokens trained, mean tokens/s (without the first window), planned
    tokens/s, peak memory and whether the run reached the planned step."""
    rows = []
    for model in plan["models"]:
        path = Path(study_dir) / f"{model['name']}.jsonl"
        recs = [r for r in _metrics(path) if "tokens_per_s" in r] if path.is_file() else []
        if not recs:
            rows.append({"name": model["name"], "steps": 0, "tokens": 0, "tokens_per_s": None,
                         "planned_tokens_per_s": model["planned_tokens_per_s"], "max_memory_gib": None,
                         "complete": False})
            continue
        rates = [r["tokens_per_s"] for r in recs]
        last = recs[-1]
        rows.append({"name": model["name"], "steps": last["step"], "tokens": last["tokens"],
                     "tokens_per_s": statistics.mean(rates[1:] or rates),
                     "planned_tokens_per_s": model["planned_tokens_per_s"],
                     "max_memory_gib": last.get("max_memory_gib"), "complete": last["step"] >= plan["steps"],
                     "elapsed_s": last.get("elapsed_s")})
    return rows


def study_table(rows: list[dict[str, Any]], planned_steps: int) -> list[str]:
    lines = ["| model | steps | tokens trained | tokens/s | planned tokens/s | training (s) | max memory (GiB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "–"
        cut = "" if r["complete"] else f" (cut: planned {planned_steps})"
        lines.append(f"| {r['name']} | {r['steps']}{cut} | {r['tokens']:,} | {rate} | "
                     f"{r['planned_tokens_per_s']:,.0f} | {r.get('elapsed_s') or '–'} | {r['max_memory_gib'] or '–'} |")
    return lines


def perplexity_table(results: str | Path) -> list[str]:
    """KERPLE Table 3's form: a row per model (RegularGPT once per depth policy), a column per evaluation length,
    perplexity on the same number of scored tokens at every length; the last column is ppl(longest) / ppl(train)."""
    rows = latest_rows(load_rows(results))
    table: dict[str, dict[int, float]] = {}
    train_length: dict[str, int] = {}
    tokens: set[int] = set()
    for row in rows:
        if row.get("skipped") or "ppl" not in row:
            continue
        label = Path(row["run"]).name if row.get("run") else row["model"]
        if row.get("depth_policy") or row.get("variant_config", {}).get("model.architecture") == "regular_gpt":
            label += f" (depth {row.get('depth_policy') or row.get('variant_config', {}).get('model.depth_policy')})"
        table.setdefault(label, {})[row["length"]] = row["ppl"]
        train_length[label] = row["train_length"]
        tokens.add(row["tokens"])
    lengths = sorted({length for values in table.values() for length in values})
    head = "| model | " + " | ".join(f"{n:,}" for n in lengths) + " | ppl(max) / ppl(train) |"
    lines = [f"Scored tokens per length: {', '.join(f'{t:,}' for t in sorted(tokens))}.", "", head,
             "|---|" + "---:|" * (len(lengths) + 1)]
    for label in sorted(table):
        values = table[label]
        ratio = "–"
        base = values.get(train_length[label])
        if base and lengths and lengths[-1] in values:
            ratio = f"{values[lengths[-1]] / base:.3f}"
        lines.append(f"| {label} | " + " | ".join(f"{values[n]:.2f}" if n in values else "–" for n in lengths)
                     + f" | {ratio} |")
    return lines


_STEP = re.compile(r"^(\w+): (.*) \((\d+) s(?:, planned (\d+) s)?\)$")


def step_lines(summary: str | Path) -> list[str]:
    """The summary's steps as a table: step, outcome, seconds, cap."""
    lines = ["| step | outcome | seconds | cap (s) |", "|---|---|---:|---:|"]
    for line in Path(summary).read_text().splitlines():
        match = _STEP.match(line.strip())
        if match:
            name, verdict, seconds, cap = match.groups()
            lines.append(f"| {name} | {verdict} | {seconds} | {cap or '–'} |")
    return lines


def _section(folder: Path, name: str, title: str, body: list[str] | None = None) -> list[str]:
    path = folder / name
    if body is None:
        if not path.is_file():
            return [f"## {title}", "", f"Not reached: no {name} came back.", ""]
        text = path.read_text().strip().splitlines()
        body = text[1:] if text and text[0].startswith("# ") else text  # the file's own title is the section's
    return [f"## {title}", "", *body, ""]


def write_readme(folder: str | Path, out: str | Path, command: str) -> str:
    """The campaign README from an unpacked campaign folder; returns its text (also written to `out`)."""
    folder = Path(folder)
    env = (folder / "env.log").read_text().strip() if (folder / "env.log").is_file() else "(no env.log)"
    meta = json.loads((folder / "campaign.json").read_text()) if (folder / "campaign.json").is_file() else {}
    lines = [f"# GPU campaign, {meta.get('date', '?')}", "",
             f"Commit {meta.get('commit', '?')}; device command `{meta.get('command', '?')}`; this page: `{command}`.",
             "", "```", env, "```", ""]
    if (folder / "summary.txt").is_file():
        lines += ["## Steps", "", *step_lines(folder / "summary.txt"), ""]
    lines += _section(folder, "corpus.md", "Corpus")
    plan = json.loads((folder / "plan.json").read_text()) if (folder / "plan.json").is_file() else None
    if plan:
        rows = study_rows(folder / "study", plan)
        lines += _section(folder, "plan.md", "Study plan")
        lines += ["## Study: what each model trained", "", *study_table(rows, plan["steps"]), ""]
    results = folder / "extrapolate" / "results.jsonl"
    body = perplexity_table(results) if results.is_file() else None
    lines += _section(folder, "extrapolate/results.jsonl", "Perplexity by evaluation length (test split)", body)
    for name, title in (("correctness.md", "Kernel correctness"), ("kernels.md", "Kernel timing"),
                        ("profile.md", "Profile of one training step")):
        lines += _section(folder, name, title)
    text = "\n".join(lines).rstrip() + "\n"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return text
