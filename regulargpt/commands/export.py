"""Export a training run's model: our model.pt (default), a plain safetensors file, or a Hugging Face folder.

Examples:
    python launch/export.py runs/regular_gpt-seed0                     # latest checkpoint → runs/.../model.pt
    python launch/export.py runs/regular_gpt-seed0 --step 1000 --out /tmp/step1000.pt
    python launch/export.py runs/regular_gpt-seed0 --format hf --out exports/rgpt   # AutoModelForCausalLM folder
    python launch/export.py runs/alibi-seed0 --format hf --out exports/alibi --eval results/lm/results.jsonl
    python launch/export.py runs/regular_gpt-seed0 --format safetensors             # → runs/.../model.safetensors

One CPU process, no GPU and no torch.distributed needed: ZeRO-1/2/3 partitions of all ranks are gathered from the
checkpoint files (DeepSpeed's zero_to_fp32), ZeRO-0 bf16 runs use the optimizer's fp32 master weights. The weights are
loaded into a fresh model (strict) before anything is written. A checkpoint that fails its checksums is refused
(exit 2, `error: ...`).

--format pt (default): model.pt, for regulargpt.checkpoint.load_model_file (read with weights_only: no pickles).
--format safetensors: the same fp32 weights under our names, the config and meta in the header (default
RUN_DIR/model.safetensors). --format hf (needs transformers, the dev extra): a folder that
AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True) and AutoTokenizer.from_pretrained(DIR) load
offline, with a model card (default RUN_DIR/hf; see docs/EXPORT.md). For these two, RUN_DIR may also be a model.pt,
and a run without checkpoints exports its model.pt.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import NoReturn

from regulargpt.cli import ROPE_SCALING_HELP, positive_int, rope_scaling_json, run
from regulargpt.errors import UserError
from regulargpt.files import remove_dead_temporaries
from regulargpt.folder_lock import hold_target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="training run directory, e.g. runs/regular_gpt-seed0 (hf/safetensors: or a model.pt)")
    p.add_argument("--step", type=positive_int, help="checkpoint step to export (default: the one 'latest' names), e.g. 1000")
    p.add_argument("--format", choices=["pt", "safetensors", "hf"], default="pt",
                   help="pt: model.pt (default); safetensors: a plain weights file; hf: a Hugging Face folder")
    p.add_argument("--out", help="output file, or folder for --format hf (default: in RUN_DIR), e.g. --out exports/rgpt")
    p.add_argument("--tokenizer", type=Path,
                   help="hf: sentencepiece .model file (default: the one the run's data manifest names)")
    p.add_argument("--eval", dest="eval_results",
                   help="hf: an eval/extrapolate.py results.jsonl (or its folder) whose rows for this run go into "
                        "the model card, e.g. --eval results/lm")
    p.add_argument("--depth-policy", choices=["adaptive", "train", "per_position"],
                   help="hf, RegularGPT only: the depth policy config.json states (default: the run's own)")
    p.add_argument("--rope-scaling", type=rope_scaling_json, default=None,
                   help="hf, RoPE models only: " + ROPE_SCALING_HELP + "; config.json carries it")
    args = p.parse_args(argv)
    if args.format != "hf" and (args.tokenizer or args.eval_results or args.depth_policy or args.rope_scaling):
        raise UserError("--tokenizer, --eval, --depth-policy and --rope-scaling are options of --format hf")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # only checkpoint files are read
    source = Path(args.run_dir)
    target = Path(args.out) if args.out else (source.parent if source.is_file() else source) / _DEFAULT[args.format]
    with hold_target(target, "export") if source.exists() else nullcontext():  # one writer per output
        return _export(args, argv)


_DEFAULT = {"pt": "model.pt", "safetensors": "model.safetensors", "hf": "hf"}  # the output's name in RUN_DIR


def _export(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.format == "pt":
        from regulargpt.train import export_model

        path = export_model(args.run_dir, step=args.step, out=args.out)
    elif args.format == "safetensors":
        from regulargpt.checkpoint import save_safetensors_file
        from regulargpt.train.export import run_weights

        run_dir, cfg, model, meta = run_weights(args.run_dir, args.step)
        path = Path(args.out) if args.out else (run_dir or Path(args.run_dir).parent) / "model.safetensors"
        remove_dead_temporaries(path)  # left by an export killed mid-write
        save_safetensors_file(path, cfg, model, meta)
    else:
        if importlib.util.find_spec("transformers") is None:
            raise UserError("--format hf needs transformers, which is not installed; install the dev extra: "
                            "pip install -e '.[dev]'")
        from regulargpt.hf.export import export_hf_run

        command = shlex.join(["python", "launch/export.py", *(sys.argv[1:] if argv is None else argv)])
        path = export_hf_run(args.run_dir, args.out, command, step=args.step, tokenizer=args.tokenizer,
                             eval_results=args.eval_results, depth_policy=args.depth_policy,
                             rope_scaling=args.rope_scaling)
    print(f"wrote {path}")
    return 0


def console() -> NoReturn:
    """The ``regulargpt-export`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
