"""lm-evaluation-harness on our export (docs/EVALUATION.md § lm-evaluation-harness): the shipped task's documents are
the split's documents; the real `lm_eval` client on an exported tiny model gives the perplexity eval/extrapolate.py
gives on the same text (the split is eos + one document, so both score exactly the same predictions)."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import fake_data_folder, load_script, run_env
from regulargpt.checkpoint import save_model_file
from regulargpt.config import load_config_dict, save_config
from regulargpt.data import Tokenizer, load_manifest
from regulargpt.evaluation.lm_eval_documents import LmEvalTaskError, load_split, split_documents
from regulargpt.evaluation.lm_report import load_rows
from regulargpt.model import build_model

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "eval" / "lm_eval_tasks"


def _tokenizer(data_dir: Path) -> Tokenizer:
    return Tokenizer.load(data_dir / load_manifest(data_dir)["tokenizer"]["file"])


def test_the_tasks_documents_are_the_splits_documents(data_dir: Path, tmp_path: Path) -> None:
    tok = _tokenizer(data_dir)
    texts = ["def f(x):\n    return x\n", "  two\tspaces é😀 0123\n\n", "last, without its eos"]
    stream = [tok.eos_id] + tok.encode(texts[0]) + [tok.eos_id, tok.eos_id] + tok.encode(texts[1]) + [tok.eos_id]
    stream += tok.encode(texts[2])  # empty pieces (before the first eos, between two) are no documents
    folder = fake_data_folder(tmp_path / "d", {"train": np.array(stream), "val": np.array(stream[:3]),
                                               "test": np.array(stream)},
                              vocab_size=tok.vocab_size, tokenizer=tok.model_proto)
    assert split_documents(folder, "test") == texts
    assert load_split(data=str(folder), version=1.0)["test"]["text"] == texts  # lm-eval passes its version too
    assert load_split(data=str(folder), split="val")["test"]["text"] == [texts[0][:len(tok.decode(stream[1:3]))]]
    with pytest.raises(LmEvalTaskError, match='--metadata \'{"data": '):
        load_split(version=1.0)
    with pytest.raises(LmEvalTaskError, match="no split 'dev'"):
        split_documents(folder, "dev")


@pytest.mark.slow
def test_lm_eval_on_the_export_gives_extrapolates_perplexity(data_dir: Path, tmp_path: Path) -> None:
    tok = _tokenizer(data_dir)
    text = "".join(split_documents(data_dir, "val")[0].splitlines(keepends=True)[:12])
    ids = tok.encode(text)
    n = len(ids)
    folder = fake_data_folder(tmp_path / "doc", {"train": np.array(ids), "val": np.array(ids),
                                                 "test": np.array([tok.eos_id] + ids)},
                              vocab_size=tok.vocab_size, tokenizer=tok.model_proto)
    cfg = load_config_dict({"model": {"vocab_size": tok.vocab_size, "d_model": 32, "n_heads": 2, "n_layers": 2,
                                      "architecture": "transformer", "position": "alibi"},
                            "data": {"path": str(folder), "seq_len": 64}})
    torch.manual_seed(0)
    model = build_model(cfg.model)
    with torch.no_grad():  # sharper than the initialisation, so that the context visibly changes the predictions
        model.head.proj.weight.mul_(8.0)
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg, run / "config.resolved.json")
    save_model_file(run / "model.pt", cfg, model, {"step": 0})
    out = tmp_path / "out"
    assert load_script("eval/extrapolate.py").main(["--runs", str(run), "--data", str(folder), "--lengths", str(n),
                                                    "--tokens", str(n), "--out", str(out), "--device", "cpu",
                                                    "--no-progress"]) == 0
    [row] = load_rows(out / "results.jsonl")
    assert row["tokens"] == n and row["windows"] == 1
    ours = row["nll"] * row["tokens"]  # Σ −log p over the document's tokens, the first one read after eos
    assert load_script("launch/export.py").main([str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
         f"pretrained={tmp_path / 'hf'},trust_remote_code=True,max_length={n}", "--include_path", str(TASKS),
         "--tasks", "regulargpt_test", "--metadata", json.dumps({"data": str(folder)}), "--batch_size", "1",
         "--device", "cpu", "--output_path", str(tmp_path / "lm_eval")],
        capture_output=True, text=True, timeout=600, env=run_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [results_file] = (tmp_path / "lm_eval").rglob("results_*.json")
    metrics = json.loads(results_file.read_text())["results"]["regulargpt_test"]
    words, size = len(re.split(r"\s+", text)), len(text.encode("utf-8"))
    for name, count in (("byte_perplexity", size), ("word_perplexity", words)):
        theirs = math.log(metrics[f"{name},none"]) * count  # back to Σ −log p
        # the same fp32 forward of the same ids, summed in another order: measured |Δ| = 6.1e-5 nats of 2,405.2
        # (2.5e-8 relative; lm-eval keeps the sum in fp32) for both metrics
        assert abs(theirs - ours) <= 1e-7 * ours, (name, theirs, ours)
    assert metrics["bits_per_byte,none"] == pytest.approx(ours / (size * math.log(2)), rel=1e-6)
