"""A run directory or model file → the model to generate with, and the tokenizer it was trained with.

The tokenizer is found through the run's data manifest (``data.path`` of the saved config, relative to the current
folder or to the repository root, as the training command saw it), or given explicitly. Either way it must be the
one the run trained with, where the run recorded that (``tokenizer_sha256`` in model.pt's meta, stored at export).

Example::

    info = load_model("results/demo/lm/runs/python-stdlib/regular_gpt-seed0", depth_policy="train")
    tok = find_tokenizer(info)           # info.model, info.cfg: the model and its resolved config
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from regulargpt.data import DataError, Tokenizer, check_tokenizer
from regulargpt.evaluation.scored_run import RunInfo, load_run, training_tokenizer_sha
from regulargpt.generation.errors import GenerationError

__all__ = ["DTYPES", "data_folder", "load_model", "find_tokenizer"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
_ROOT = Path(__file__).resolve().parents[2]


def load_model(path: str | Path, depth_policy: str | None = None, device: str = "cpu",
               dtype: str = "fp32", rope_scaling: dict[str, Any] | None = None) -> RunInfo:
    """A run directory or model file → RunInfo whose model (a language model, eval mode) is on `device` in `dtype`.

    `depth_policy` runs a RegularGPT with another depth policy than it was trained with (same weights);
    `rope_scaling` rescales a RoPE model's frequencies (``model.rope_scaling``; same weights)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise GenerationError("--device cuda: no CUDA device is available here (use --device cpu)")
    info = load_run(path, device, depth_policy, rope_scaling)
    for param in info.model.parameters():  # buffers (ALiBi slopes, RoPE frequencies) stay fp32, as in evaluation
        param.data = param.data.to(DTYPES[dtype])
    return info


def data_folder(data_path: str) -> Path | None:
    """The prepared data folder a run's ``data.path`` names, looked up from the current folder, then from the
    repository root; None when neither holds a manifest.json there."""
    for base in (Path.cwd(), _ROOT):
        candidate = base / data_path
        if (candidate / "manifest.json").is_file():
            return candidate
    return None


def find_tokenizer(info: RunInfo, tokenizer: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a loaded run: `tokenizer` if given, else the one its data manifest names. GenerationError
    when none is found or it is not the one the run trained with."""
    data_path = (info.cfg.data.folders or [""])[0]  # a mixture's folders share one tokenizer
    try:
        if tokenizer is not None:
            tok = Tokenizer.load(tokenizer)
        else:
            folder = data_folder(data_path) if data_path else None
            if folder is None:
                raise GenerationError(f"cannot find the run's data folder {data_path!r} (its data.path, looked up "
                                      f"from {Path.cwd()} and {_ROOT}) to read its tokenizer; pass --tokenizer "
                                      f"FILE.model")
            tok = Tokenizer.load(check_tokenizer(folder))
    except DataError as err:
        raise GenerationError(str(err)) from None
    trained = training_tokenizer_sha(info)
    if trained is not None and trained[0] != tok.sha256:
        raise GenerationError(f"tokenizer {tok.path} (sha256 {tok.sha256[:12]}…) is not the one the run trained "
                              f"with ({trained[0][:12]}…, from {trained[1]})")
    return tok
