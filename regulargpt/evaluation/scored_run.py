"""A trained language model as the evaluation jobs see it: :class:`RunInfo` (config, model, the weights' step and
sha256), :func:`load_run` (refusing a model.pt older than its run's newest checkpoint,
:mod:`regulargpt.evaluation.run_weights`), its table variant (what the run is, without its seed) and the checks
that it fits an evaluation data folder (vocabulary, tokenizer sha256, token range). Used by the length sweep
(:mod:`regulargpt.evaluation.length_sweep`), generation and the Hugging Face export."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from regulargpt.checkpoint import load_model_file
from regulargpt.config import Config, ConfigError, config_to_dict
from regulargpt.config.rope_scaling import describe_rope_scaling
from regulargpt.data import DataError, TokenSplit, load_manifest, open_split
from regulargpt.data.verify import DEFAULT_LEVEL
from regulargpt.evaluation.perplexity import EvalError, model_label
from regulargpt.evaluation.run_weights import check_fresh, weights_sha256
from regulargpt.files import read_json_object
from regulargpt.run_directory.layout import MODEL_FILE

__all__ = ["RunInfo", "check_compatible", "load_run", "open_eval_split", "run_variant", "training_tokenizer_sha",
           "variant_id"]

# Config keys that do not change what a run is (bookkeeping, resources): left out of its variant.
_NOT_VARIANT = {"model": {"attention_memory_mb"},
                "train": {"seed", "log_every", "eval_every", "eval_batches", "save_every", "keep_last", "max_bad_steps",
                          "divergence_factor"}}  # a stop rule: it changes no trained weight
# Hyperparameters of one position scheme: left out of the variants of the others (so runs keep the variant id they
# had before these fields existed).
_POSITION_KNOBS = {"xpos": ("xpos_gamma", "xpos_scale_base"), "sandwich": ("sandwich_dim",),
                   "fire": ("fire_mlp_width", "fire_init_c", "fire_init_threshold")}


def run_variant(cfg: Config, meta: dict[str, Any]) -> dict[str, Any]:
    """What a run is, without its seed: the resolved model and training config (dotted keys), the training length and
    dataset, and ``checkpoint_step`` when the model is not the run's final step. Runs with equal variants differ
    only in the seed and belong in one table row."""
    d = config_to_dict(cfg)
    out = {f"{section}.{k}": v for section in ("model", "train") for k, v in d[section].items()
           if k not in _NOT_VARIANT[section]}
    if not cfg.train.extended_from:  # a key added later: runs that were never extended keep their variant id
        del out["train.extended_from"]
    if not cfg.model.window:  # likewise: unwindowed runs keep the variant id they had before model.window existed
        del out["model.window"]
    if not cfg.model.rope_scaling:  # and unscaled runs the one they had before model.rope_scaling existed
        del out["model.rope_scaling"]
    for position, knobs in _POSITION_KNOBS.items():
        if cfg.model.position != position:
            for knob in knobs:
                del out[f"model.{knob}"]
    out["data.seq_len"] = cfg.data.seq_len
    out["data.dataset"] = Path(cfg.data.path).name if cfg.data.path else ""
    if cfg.data.paths:  # a mixture (single-folder runs keep the variant id they had before mixtures existed)
        out["data.dataset"] = "+".join(Path(p).name for p in cfg.data.paths)
        out["data.weights"] = cfg.data.weights
    step = meta.get("step")
    if isinstance(step, int) and step != cfg.train.steps:
        out["checkpoint_step"] = step
    return out


def variant_id(variant: dict[str, Any]) -> str:
    """A short stable id of a variant (sha1 of its canonical JSON)."""
    return hashlib.sha1(json.dumps(variant, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class RunInfo:
    """One trained model to evaluate: its key (the run path as given), config, model and what the tables show."""

    run: str
    path: Path
    cfg: Config
    model: nn.Module
    meta: dict[str, Any]
    depth_override: str | None = None  # an evaluation-time depth policy (None: the model's own)
    weights_sha256: str = ""  # run_weights.weights_sha256 of the fp32 weights as loaded
    note: str | None = None  # said once before the run is used: a named model file older than its run's newest

    @property
    def step(self) -> int | None:
        """The training step of the weights (model.pt's meta), None when the file does not record it."""
        step = self.meta.get("step")
        return step if isinstance(step, int) else None

    @property
    def label(self) -> str:
        return model_label(self.cfg.model)

    @property
    def seed(self) -> int:
        return self.cfg.train.seed

    @property
    def params(self) -> int:
        """The model's parameter count (rows report it; the memory estimate counts its fp32 weights)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def variant(self) -> dict[str, Any]:
        return run_variant(self.cfg, self.meta)


def load_run(run: str | Path, device: torch.device | str = "cpu", depth_policy: str | None = None,
             rope_scaling: dict[str, Any] | None = None) -> RunInfo:
    """A run directory holding model.pt, or a model.pt path → RunInfo (model in eval mode on `device`).

    `depth_policy` scores a RegularGPT with another depth policy than it was trained with (same weights); other
    architectures load with their own (their rows are keyed and labelled as without it). `rope_scaling` (a checked
    ``model.rope_scaling`` object, :mod:`regulargpt.config.rope_scaling`) rescales a RoPE model's frequencies (same
    weights); EvalError naming the run and the scaling for a model without RoPE. A run directory whose
    model.pt is older than its newest checkpoint is refused (:func:`regulargpt.evaluation.run_weights.check_fresh`).
    """
    path = Path(run)
    model_path = path / MODEL_FILE if path.is_dir() else path
    if not model_path.is_file():
        if path.is_dir() and (path / "latest").is_file():  # trained (or stopped) but not exported
            raise EvalError(f"run directory {path} has no model.pt but has checkpoints (latest: "
                            f"{(path / 'latest').read_text().strip()}); export one with "
                            f"`python launch/export.py {path}`")
        where = f"run directory {path} has no model.pt" if path.is_dir() else f"{path} does not exist"
        raise EvalError(f"{where}; train it with `python launch/pretrain.py --config FILE --run-dir {path}` first")
    try:
        cfg, model, meta = load_model_file(model_path, map_location=device,
                                           model_overrides={"depth_policy": depth_policy} if depth_policy else None,
                                           override_architectures=frozenset({"regular_gpt"}))
    except ConfigError as err:
        raise EvalError(f"{model_path}: --depth-policy {depth_policy}: {err}") from None
    if not isinstance(cfg, Config):  # a FormalConfig: a sequence classifier
        raise EvalError(f"{model_path}: a sequence classifier (head {cfg.model.head!r}), not a language model; "
                        f"perplexity and generation need a model trained by launch/pretrain.py (head 'lm')")
    if rope_scaling:
        cfg, model = _with_rope_scaling(model_path, cfg, model, rope_scaling)
    note = check_fresh(path, model_path, meta)
    depth = depth_policy if cfg.model.architecture == "regular_gpt" else None
    return RunInfo(str(run).rstrip("/"), model_path, cfg, model.to(device).eval(), meta, depth,
                   weights_sha256(model.state_dict()), note)


def _with_rope_scaling(model_path: Path, cfg: Config, model: nn.Module,
                       scaling: dict[str, Any]) -> tuple[Config, nn.Module]:
    """The config with ``model.rope_scaling`` = `scaling` and the model rebuilt from it with the same weights."""
    from regulargpt.model import build_model

    try:
        scaled = dataclasses.replace(cfg.model, rope_scaling=scaling)
    except ConfigError as err:
        raise EvalError(f"{model_path}: --rope-scaling {describe_rope_scaling(scaling)}: {err}") from None
    rebuilt = build_model(scaled)
    rebuilt.load_state_dict(model.state_dict())
    return dataclasses.replace(cfg, model=scaled), rebuilt


def training_tokenizer_sha(info: RunInfo) -> tuple[str, str] | None:
    """(sha256 of the tokenizer the run trained with, where it was found), if the run recorded it.

    Read from model.pt's meta (``tokenizer_sha256``, stored at export). A model.pt exported before the hash was
    stored: the data fingerprint in the ``trainer_state.json`` of the checkpoint it was exported from, else the
    manifest of the run's ``data.path`` (a mixture's first folder) if that folder exists.
    """
    meta_sha = info.meta.get("tokenizer_sha256")
    if isinstance(meta_sha, str) and meta_sha:
        return meta_sha, f"{info.path} meta"
    state = info.path.parent / str(info.meta.get("checkpoint", "")) / "trainer_state.json"
    if info.meta.get("checkpoint") and state.is_file():
        sha = read_json_object(state).get("data", {}).get("tokenizer_sha256")
        if isinstance(sha, str) and sha:
            return sha, str(state)
    folder = _first_folder(info.cfg)
    if folder and (Path(folder) / "manifest.json").is_file():
        try:
            return load_manifest(folder)["tokenizer"]["sha256"], f"{folder}/manifest.json"
        except DataError:
            return None
    return None


def _training_tokenizer_file(info: RunInfo) -> str:
    """Where the run's tokenizer file is: in the data folder it trained on (its data.path; a run directory holds
    none), or a description of it when that folder is not here."""
    folder = _first_folder(info.cfg)
    try:
        manifest = load_manifest(folder)
        return str(Path(folder) / manifest["tokenizer"]["file"])
    except (DataError, KeyError, TypeError):
        return f"<the tokenizer.model of the data folder the run trained on, data.path={folder!r}>"


def _first_folder(cfg: Config) -> str:
    """The run's data folder (a mixture's first: its folders share the tokenizer), or "" when it names none."""
    return (cfg.data.folders or [""])[0]


def open_eval_split(data_dir: str | Path, split: str, verify: str = DEFAULT_LEVEL) -> TokenSplit:
    """Open the held-out split, checked against its manifest at level `verify` (:mod:`regulargpt.data.verify`);
    EvalError (not a traceback) when the folder or split is missing, damaged or corrupt."""
    try:
        tokens = open_split(data_dir, split, verify=verify)
        if not tokens.tokenizer_path.is_file():
            raise EvalError(f"data folder {data_dir} has no tokenizer file {tokens.tokenizer_path.name} (listed in its "
                            f"manifest.json); re-run data_prep/prepare.py for it")
        return tokens
    except DataError as err:
        raise EvalError(str(err)) from None


def check_compatible(info: RunInfo, split: TokenSplit) -> None:
    """The run's vocabulary and tokenizer must be the data folder's; EvalError naming both otherwise."""
    vocab = info.cfg.model.vocab_size
    if vocab != split.vocab_size:
        raise EvalError(f"{info.run}: model vocab_size {vocab} does not match data folder {split.data_dir} "
                        f"(vocab_size {split.vocab_size}); evaluate on data tokenised with the run's tokenizer")
    found = training_tokenizer_sha(info)
    data_sha = split.manifest["tokenizer"]["sha256"]
    if found is not None and found[0] != data_sha:
        raise EvalError(f"{info.run}: trained with tokenizer sha256 {found[0][:12]}… ({found[1]}) but data folder "
                        f"{split.data_dir} was tokenised with {data_sha[:12]}…; prepare the evaluation data with "
                        f"`python data_prep/prepare.py --tokenizer {_training_tokenizer_file(info)} …`")
    try:
        split.check_token_range(vocab)
    except DataError as err:
        raise EvalError(str(err)) from None
