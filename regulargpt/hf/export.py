"""A trained run → a folder that ``transformers`` loads offline (``python launch/export.py RUN --format hf``).

    DIR/config.json              RegularGPTConfig: the run's model section, depth_policy, auto_map, special ids
    DIR/modeling_regulargpt.py   three imports from regulargpt.hf (the code stays in regulargpt: install it)
    DIR/model.safetensors        fp32 weights, ``model.<our state-dict name>``
    DIR/generation_config.json   eos/pad ids and launch/generate.py's sampling defaults
    DIR/tokenizer.json           the sentencepiece model as an exact tokenizers BPE (regulargpt.hf.tokenizer)
    DIR/tokenizer_config.json    TokenizersBackend, special tokens, split_special_tokens
    DIR/tokenizer.model          the sentencepiece model itself
    DIR/README.md                the model card (regulargpt.hf.model_card)

The folder is written under a temporary name beside DIR and renamed into place; an existing DIR is replaced only
when it is empty or an earlier regulargpt export. Load it::

    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)   # depth_policy=... to override
    tok = AutoTokenizer.from_pretrained(DIR)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from torch import nn
from transformers import GenerationConfig
from transformers.utils import logging as hf_logging

from regulargpt.config import Config, ConfigError, config_to_dict
from regulargpt.data import Tokenizer, load_manifest
from regulargpt.errors import UserError
from regulargpt.evaluation.lm_report import load_rows
from regulargpt.evaluation.scored_run import RunInfo
from regulargpt.files import atomic_write_text, remove_dead_temporaries
from regulargpt.write_errors import explain_write_error
from regulargpt.generation.loading import data_folder, find_tokenizer
from regulargpt.hf.configuration import RegularGPTConfig
from regulargpt.hf.model_card import evaluation_rows, model_card
from regulargpt.hf.modeling import RegularGPTForCausalLM
from regulargpt.hf.tokenizer import save_hf_tokenizer
from regulargpt.run_directory.layout import MODEL_FILE
from regulargpt.train.export import run_weights

__all__ = ["ExportError", "MODELING_FILE", "export_hf", "export_hf_run"]

MODELING_FILE = "modeling_regulargpt.py"

_MODELING_SOURCE = '''"""The Hugging Face entry point of a regulargpt model (written by regulargpt/hf/export.py).

The network runs on regulargpt's own code, not on a copy of it: the regulargpt package must be installed here.
"""

try:
    from regulargpt.hf.configuration import RegularGPTConfig
    from regulargpt.hf.modeling import RegularGPTForCausalLM
except ImportError as err:
    raise ImportError(
        "this model was exported by regulargpt and runs on its code: install the regulargpt package in this Python "
        "environment (pip install -e /path/to/regulargpt, or pip install -e '/path/to/regulargpt[dev]' for "
        f"transformers too); importing it failed with: {err}"
    ) from err

__all__ = ["RegularGPTConfig", "RegularGPTForCausalLM"]
'''

# The sampling defaults of launch/generate.py, so that `generate()` without arguments samples as it does.
_SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95, "max_new_tokens": 200}


class ExportError(UserError, ValueError):
    """An export that cannot be written as asked; the message says what to change."""


def _recover(out: Path) -> None:
    """Undo what an export killed mid-way left: its temporary folder ``.<name>.<pid>.tmp-*`` (pid ended) goes, an
    earlier export set aside as ``.<name>.old`` comes back when the kill fell between the two renames (no `out`),
    and is removed when the new export had already replaced it."""
    remove_dead_temporaries(out)
    old = out.with_name(f".{out.name}.old")
    if old.is_dir() and not out.exists():
        old.rename(out)
    elif old.is_dir():
        shutil.rmtree(old, ignore_errors=True)


def _check_target(out: Path) -> None:
    if not out.exists():
        return
    config = out / "config.json"
    earlier = config.is_file() and '"regulargpt"' in config.read_text(errors="replace")
    if not out.is_dir() or (any(out.iterdir()) and not earlier):
        raise ExportError(f"--out {out}: exists and is not an earlier regulargpt export; give a new folder")


def _usual_permissions(folder: Path) -> None:
    """The folder and its files as the umask makes new ones (mkdtemp and the weights writer make them private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def export_hf(out: str | Path, cfg: Config, model: nn.Module, tok: Tokenizer, card: str,
              depth_policy: str | None = None) -> Path:
    """Write the Hugging Face folder of a language model (see the module docstring) → its path.

    `depth_policy` (RegularGPT only): the policy ``config.json`` states, by default the run's own."""
    out = Path(out)
    _recover(out)
    _check_target(out)
    if tok.vocab_size != cfg.model.vocab_size:
        raise ExportError(f"tokenizer {tok.path} has {tok.vocab_size} pieces; the model's vocabulary is "
                          f"{cfg.model.vocab_size} (not the tokenizer the run trained with?)")
    regular = cfg.model.architecture == "regular_gpt"
    special = {"eos_token_id": tok.eos_id, "bos_token_id": tok.eos_id,  # as the tokenizer: bos = eos (hf/tokenizer.py)
               "pad_token_id": tok.pad_id if tok.pad_id >= 0 else None}
    hf_config = RegularGPTConfig(
        regulargpt=config_to_dict(cfg)["model"], depth_policy=(depth_policy or cfg.model.depth_policy) if regular else None,
        architectures=["RegularGPTForCausalLM"], dtype="float32",
        auto_map={"AutoConfig": f"{MODELING_FILE[:-3]}.RegularGPTConfig",
                  "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.RegularGPTForCausalLM"}, **special)
    hf_model = RegularGPTForCausalLM(hf_config)
    hf_model.model.load_state_dict(model.state_dict(), strict=True)
    hf_model.generation_config = GenerationConfig(**special, **_SAMPLING)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.tmp-", dir=out.parent))
    needed = sum(t.numel() * t.element_size() for t in hf_model.state_dict().values())
    try:
        with explain_write_error(tmp, "the Hugging Face folder", needed):
            hf_logging.disable_progress_bar()
            hf_model.save_pretrained(str(tmp))
            save_hf_tokenizer(tok, tmp)
            (tmp / MODELING_FILE).write_text(_MODELING_SOURCE)
            atomic_write_text(tmp / "README.md", card)
        _usual_permissions(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_hf_run(source: str | Path, out: str | Path | None, command: str, step: int | None = None,
                  tokenizer: str | Path | None = None, eval_results: str | Path | None = None,
                  depth_policy: str | None = None, rope_scaling: dict[str, Any] | None = None) -> Path:
    """The Hugging Face export of a run directory or model.pt (default `out`: RUN/hf), with its tokenizer (the data
    manifest's, or `tokenizer`), its model card, and the rows of `eval_results` that scored it. `rope_scaling` (a
    checked ``model.rope_scaling``, RoPE models only) goes into config.json's ``regulargpt`` object: the exported
    model runs with it (the weights are the run's)."""
    run_dir, cfg, model, meta = run_weights(source, step)
    if rope_scaling:
        try:
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, rope_scaling=rope_scaling))
        except ConfigError as err:
            raise ExportError(f"--rope-scaling: {source}: {err}") from None
    if depth_policy is not None and cfg.model.architecture != "regular_gpt":
        raise ExportError(f"--depth-policy {depth_policy}: {source} is a {cfg.model.architecture} model; the depth "
                          f"policy is RegularGPT's")
    where = (run_dir or Path(source).parent) / MODEL_FILE
    tok = find_tokenizer(RunInfo(str(source), where, cfg, model, meta), tokenizer)
    folder = data_folder(cfg.data.folders[0]) if cfg.data.folders else None  # a mixture: its first folder
    manifest = load_manifest(folder) if folder is not None else None
    rows: list[dict[str, Any]] = []
    if eval_results is not None:
        path = Path(eval_results)
        path = path / "results.jsonl" if path.is_dir() else path
        try:
            rows = evaluation_rows(load_rows(path), cfg, meta)
        except FileNotFoundError as err:
            raise ExportError(f"--eval {eval_results}: {err}") from None
        if not rows:
            raise ExportError(f"--eval {path}: no finished row scored this run (same variant and seed); evaluate it "
                              f"with eval/extrapolate.py first, or leave --eval out")
    params = sum(p.numel() for p in model.parameters())
    policy = (depth_policy or cfg.model.depth_policy) if cfg.model.architecture == "regular_gpt" else None
    card = model_card(cfg, meta, params, run_dir, manifest, rows, str(eval_results) if rows else None, command,
                      policy)
    target = Path(out) if out is not None else (run_dir or Path(source).parent) / "hf"
    return export_hf(target, cfg, model, tok, card, depth_policy)

