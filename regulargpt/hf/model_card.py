"""The ``README.md`` of an exported model, generated from its run: what it is, how it was trained, how it scores.

Sections: how to load it; the architecture (every field of the run's ``model`` section, and the parameter count);
training (the command that reproduces the run from its resolved config, steps, tokens seen, the last validation
loss of ``metrics.jsonl``); the training data (its ``manifest.json``: source, splits, tokenizer hash); the
perplexity-vs-length rows of an evaluation (``eval/extrapolate.py``'s ``results.jsonl``) that scored this run
(same variant and seed); and the export's own provenance. A fact the run does not hold is stated as missing,
never guessed. Nothing here imports ``transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from regulargpt.config import Config, config_to_dict
from regulargpt.evaluation.scored_run import run_variant, variant_id
from regulargpt.evaluation.perplexity import model_label
from regulargpt.files import read_jsonl
from regulargpt.provenance import provenance
from regulargpt.run_directory.layout import CONFIG_FILE, METRICS_FILE

__all__ = ["evaluation_rows", "model_card"]


def evaluation_rows(rows: Sequence[dict[str, Any]], cfg: Config, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The finished rows of an evaluation results file that scored this model: same variant (resolved model and
    training config, data, checkpoint step) and seed; the last row per (depth policy, dataset, split, protocol,
    length) wins, as in the evaluation's own tables."""
    vid, seed = variant_id(run_variant(cfg, meta)), cfg.train.seed
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        if row.get("variant") == vid and row.get("seed") == seed and row.get("ppl") is not None:
            key = (row.get("depth_policy"), row.get("dataset"), row.get("split"), row.get("protocol"), row["length"])
            latest[key] = row
    return list(latest.values())


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]


def _architecture(cfg: Config, params: int) -> list[str]:
    fields = sorted(config_to_dict(cfg)["model"].items())
    return ["## Architecture", "", f"{model_label(cfg.model)}, {params:,} parameters. The run's `model` section "
            f"(`config.json` → `regulargpt`):", "",
            *_table(["field", "value"], [(f"`{k}`", f"`{json.dumps(v)}`") for k, v in fields]), ""]


def _training(cfg: Config, meta: dict[str, Any], run_dir: Path | None) -> list[str]:
    lines = ["## Training", ""]
    if run_dir is None:
        return lines + ["Exported from a model file outside a run directory: the training command, metrics and "
                        "data are not known here.", ""]
    rows = read_jsonl(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
    val = [r for r in rows if r.get("val_loss") is not None]
    tokens = meta.get("tokens") or (rows[-1].get("tokens") if rows else None)
    t = cfg.train
    lines += [f"- Command (the run records its resolved config, not its launcher's command line; this reproduces "
              f"it, with as many ranks as it had): `python launch/pretrain.py --config {run_dir / CONFIG_FILE} "
              f"--run-dir {run_dir}`",
              f"- Steps: {meta.get('step', 'not recorded')} (`train.steps` = {t.steps}); micro-batch {t.batch_size} "
              f"× grad_accum {t.grad_accum} per rank, sequence length {cfg.data.seq_len}, lr {t.lr:g} "
              f"({t.schedule}), {t.precision}, ZeRO-{t.zero_stage}, seed {t.seed}",
              f"- Tokens seen: {f'{tokens:,}' if isinstance(tokens, int) and tokens else 'not recorded'}",
              f"- Validation loss: {val[-1]['val_loss']:.4f} nats/token at step {val[-1]['step']} "
              f"(`{METRICS_FILE}`)" if val else f"- Validation loss: none in `{METRICS_FILE}`", ""]
    return lines


def _data(cfg: Config, manifest: dict[str, Any] | None) -> list[str]:
    lines = ["## Training data", ""]
    if cfg.data.paths:  # a mixture: its folders share one tokenizer; the first one's manifest is described
        weights = cfg.data.weights or ["by train tokens"] * len(cfg.data.paths)
        lines += ["A mixture (`data.paths`, `data.weights`): " + ", ".join(
            f"`{p}` ({w})" for p, w in zip(cfg.data.paths, weights)) + "; the first folder:", ""]
    folder = (cfg.data.folders or [""])[0]
    if manifest is None:
        return lines + [f"The data folder `{folder}` (the run's `data.path`) was not found at export.", ""]
    source, tok = manifest.get("source", {}), manifest.get("tokenizer", {})
    splits = manifest.get("splits", {})
    lines += [f"`{folder}/manifest.json`: source `{source.get('spec', '?')}` ({source.get('kind', '?')}, "
              f"{_count(source.get('documents'))} documents, {_count(source.get('bytes'))} bytes), vocabulary "
              f"{manifest.get('vocab_size')}, tokenizer sha256 `{tok.get('sha256', '?')}`, prepared by "
              f"`{manifest.get('command', '?')}` at {manifest.get('created_at', '?')}.", "",
              *_table(["split", "documents", "tokens"],
                      [(name, _count(s.get("documents")), _count(s.get("tokens"))) for name, s in splits.items()]),
              "", "Each document's tokens end with the eos token `</s>`; no bos."]
    return lines + [""]


def _evaluation(rows: Sequence[dict[str, Any]], source: str | None) -> list[str]:
    lines = ["## Perplexity vs evaluation length", ""]
    if not rows:
        return lines + ["No evaluation of this run was given at export (`--eval RESULTS.jsonl`).", ""]
    lengths = sorted({r["length"] for r in rows})
    groups: dict[tuple[Any, ...], dict[int, float]] = {}
    for r in rows:
        key = (r.get("depth_policy") or "own", r.get("dataset"), r.get("split"), r.get("protocol"))
        groups.setdefault(key, {})[r["length"]] = r["ppl"]
    table = [(*key, *(f"{ppl[n]:.3f}" if n in ppl else "" for n in lengths)) for key, ppl in groups.items()]
    return lines + [f"From `{source}` (`eval/extrapolate.py`):", "",
                    *_table(["depth policy", "dataset", "split", "protocol", *(f"L={n}" for n in lengths)], table), ""]


def model_card(cfg: Config, meta: dict[str, Any], params: int, run_dir: Path | None, manifest: dict[str, Any] | None,
               eval_rows: Sequence[dict[str, Any]], eval_source: str | None, command: str,
               depth_policy: str | None = None) -> str:
    """The README.md text of an export made by `command` (see the module docstring); `depth_policy`: the one
    ``config.json`` states (RegularGPT)."""
    label = model_label(cfg.model)
    name = run_dir.name if run_dir is not None else str(meta.get("run_dir", "model"))
    policy = (f" Depth policy: `{depth_policy}` (trained with `{cfg.model.depth_policy}`; choose another at load "
              f"time with `depth_policy=\"train\"`, `\"per_position\"` or `\"adaptive\"`: same weights)."
              if depth_policy else "")
    stamp = provenance(command)
    lines = ["---", "library_name: transformers", f"tags: [regulargpt, text-generation, {json.dumps(label)}]", "---",
             "", f"# {label}: {name}", "",
             f"A {label} language model trained with regulargpt and exported to the Hugging "
             f"Face format. The modeling code is regulargpt's own: loading needs the `regulargpt` package installed "
             f"(`pip install -e /path/to/regulargpt`) and `trust_remote_code=True`.{policy}", "",
             "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             "tok = AutoTokenizer.from_pretrained(DIR)",
             "model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)",
             "out = model.generate(**tok(\"def \", return_tensors=\"pt\"), do_sample=False, max_new_tokens=40)",
             "print(tok.decode(out[0], skip_special_tokens=True))", "```", "",
             *_architecture(cfg, params), *_training(cfg, meta, run_dir), *_data(cfg, manifest),
             *_evaluation(eval_rows, eval_source),
             "## Export", "", f"`{stamp['command']}` at commit `{stamp['commit']}` on {stamp['machine']}, "
             f"{stamp['date']}; weights from {meta.get('checkpoint') or 'model.pt'} (fp32).", ""]
    return "\n".join(lines)
