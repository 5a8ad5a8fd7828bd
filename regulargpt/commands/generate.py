"""Generate text from a trained language model (RegularGPT or a baseline) with cached decoding.

Examples:
    python launch/generate.py results/demo/lm/runs/python-stdlib/regular_gpt-seed0 --prompt "def " --seed 0
    python launch/generate.py runs/alibi-seed0/model.pt --prompt-file prompt.py --max-new-tokens 400 --top-p 0.9
    python launch/generate.py runs/regular_gpt-seed0 --prompt "import " --greedy --stream --depth-policy train
    python launch/generate.py runs/regular_gpt-seed0 --prompt "class " --num-samples 3 --temperature 1.2 --top-k 20

Prints the prompt followed by its continuation (with --stream, token by token as it is generated), and on stderr
which weights it used (step, sha256) and at the end the new tokens, tokens/s and the cache's size. Generation stops
after --max-new-tokens tokens or at the tokenizer's end-of-text id. A run directory whose model.pt is older than the
run's newest checkpoint is refused (export it again, or name the model file to use those weights). The tokenizer is
the one the run's data manifest names (its config's data.path), or --tokenizer. Same seed, same output. RegularGPT
decodes in constant time and memory per token under --depth-policy train; see docs/GENERATION.md. Bad input (an
empty prompt, ids outside the vocabulary, more positions than a learned-position model has, temperature <= 0 without
--greedy) is a one-line `error: ...` with exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

# Before torch loads OpenMP: idle threads sleep instead of spinning (spinning is many times slower on a shared CPU).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from regulargpt.cli import ROPE_SCALING_HELP, non_negative_int, positive_int, rope_scaling_json, run


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="RUN_DIR_OR_MODEL_PT",
                   help="training run directory holding model.pt, or a model.pt path, e.g. runs/regular_gpt-seed0")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help='text to continue, e.g. --prompt "def "')
    source.add_argument("--prompt-file", type=Path, help="read the prompt from a file, e.g. --prompt-file start.py")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=200, help="tokens to generate at most (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature, > 0 (default 0.8)")
    p.add_argument("--top-k", type=non_negative_int, default=50, help="sample from the k most likely tokens; 0 = all (default 50)")
    p.add_argument("--top-p", type=float, default=0.95,
                   help="sample from the smallest set of tokens with this total probability; 1 = all (default 0.95)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed of the sampler (default 0), e.g. --seed 3")
    p.add_argument("--num-samples", type=positive_int, default=1, help="continuations to generate, as one batch (default 1)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (no sampling)")
    p.add_argument("--stream", action="store_true", help="print each token as it is generated (one sample only)")
    p.add_argument("--depth-policy", choices=["train", "per_position", "adaptive"],
                   help="RegularGPT only: depth steps at inference (default: the model's own), e.g. --depth-policy "
                        "train for constant memory per token")
    p.add_argument("--rope-scaling", type=rope_scaling_json, default=None, help=ROPE_SCALING_HELP)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="weights and caches (default fp32)")
    p.add_argument("--tokenizer", type=Path,
                   help="sentencepiece .model file (default: the one the run's data manifest names)")
    return p


class _Printer:
    """Prints the text of a growing list of ids incrementally: the new part of decode(ids) each time, holding back a
    trailing U+FFFD (a multi-byte character whose remaining bytes have not been generated yet) until `finish`."""

    def __init__(self, decode: Callable[[list[int]], str], ids: list[int]) -> None:
        self.decode, self.ids, self.shown = decode, list(ids), ""
        self._show(decode(self.ids))

    def _show(self, text: str) -> None:
        if text.startswith(self.shown):
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text

    def add(self, ids: list[int]) -> None:
        self.ids += ids
        self._show(self.decode(self.ids).rstrip("\ufffd"))

    def finish(self) -> None:
        self._show(self.decode(self.ids))
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from regulargpt.generation import GenerationError, SamplingConfig, generate
    from regulargpt.generation.generate import GenerationStats
    from regulargpt.generation.loading import find_tokenizer, load_model

    if args.stream and args.num_samples != 1:
        raise GenerationError("--stream prints one sample as it is generated; use it with --num-samples 1")
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise GenerationError(f"--prompt-file {args.prompt_file} does not exist")
        text = args.prompt_file.read_text()
    else:
        text = args.prompt
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, greedy=args.greedy)
    info = load_model(args.model, args.depth_policy, args.device, args.dtype, args.rope_scaling)
    tok = find_tokenizer(info, args.tokenizer)
    if info.note:
        print(info.note, file=sys.stderr, flush=True)
    prompt = tok.encode(text)
    eos = tok.eos_id

    def visible(ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] == eos else ids

    printer = _Printer(tok.decode, prompt) if args.stream else None
    stats, start = GenerationStats(), time.perf_counter()
    samples = generate(info.model, prompt, args.max_new_tokens, sampling, seed=args.seed, num_samples=args.num_samples,
                       eos_id=eos, on_tokens=None if printer is None else lambda ids: printer.add(visible(ids)),
                       stats=stats)
    seconds = time.perf_counter() - start
    if printer is not None:
        printer.finish()
    else:
        for i, ids in enumerate(samples):
            if args.num_samples > 1:
                print(f"--- sample {i + 1} of {args.num_samples} ---")
            print(tok.decode(prompt + visible(ids)), flush=True)
    new = sum(len(ids) for ids in samples)
    depth = f", depth policy {info.depth_override}" if info.depth_override else ""
    rate = new / max(seconds, 1e-9)
    print(f"{info.path} ({info.label}, step {info.step}, weights sha256 {info.weights_sha256[:12]}{depth}): {new} new "
          f"tokens ({args.num_samples} sample(s), prompt {len(prompt)}) in {seconds:.2f} s, {rate:.1f} tokens/s with "
          f"the prompt's prefill; cache {stats.cache_bytes / 2**20:.2f} MiB at {stats.positions} positions",
          file=sys.stderr)
    return 0


def console() -> NoReturn:
    """The ``regulargpt-generate`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
