"""Every command in README.md's code blocks runs as written, top to bottom, at tiny sizes (issue 24).

The commands are read from README.md itself: each fenced block's lines, continuation lines joined, comments and
blank lines dropped; a ```python block is one command, ``python -c`` with the block as its program. Each one must appear in exactly one of two tables below:

- ``TINY``: run in a scratch folder laid out like a fresh clone (``configs/``, ``launch/``, ``eval/``,
  ``data_prep/`` linked in), with the venv's ``bin`` first on ``PATH`` as ``source .venv/bin/activate`` does, in
  README order, each using what the ones before it made. A command runs as written except for the listed
  replacements (a step count, a token count) and the listed arguments appended (``--set`` overrides that make it
  tiny); it must exit 0.
- ``SKIPPED``: left out, each with the reason.

A command added to or changed in README.md without an entry here fails the test, so nothing is skipped by silence.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

README = ROOT / "README.md"

# Tiny language model for every pretraining command (the same for a run and its extension: a resume compares them).
_LM = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "data.seq_len=32", "--set",
       "train.batch_size=2", "--set", "train.steps=4", "--set", "train.save_every=2", "--set", "train.eval_every=2",
       "--set", "train.eval_batches=1", "--set", "logging.progress=false"]
_FORMAL_SWEEP = ["--set", "train.steps=3", "--set",
                 "eval.max_length=45", "--set", "eval.samples_per_length=4", "--set", "eval.select_last=1"]

# README's Hugging Face snippet (a ```python block), run as `python -c` after the export it loads
HF_SNIPPET = """from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("exports/rgpt", trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained("exports/rgpt", trust_remote_code=True, depth_policy="train")
print(tok.decode(model.generate(**tok("def ", return_tensors="pt"), max_new_tokens=40)[0], skip_special_tokens=True))
"""

# command as README.md writes it → (replacements old → new, arguments appended)
TINY: dict[str, tuple[dict[str, str], list[str]]] = {
    "python data_prep/prepare.py --source python-stdlib --out data/stdlib-2k --vocab-size 2048":
        ({}, ["--max-bytes", "1000000", "--num-proc", "1"]),
    "python launch/pretrain.py --config configs/tiny/regular_gpt.json --set data.path=data/stdlib-2k": ({}, _LM),
    "torchrun --standalone --nproc_per_node 2 launch/pretrain.py --config configs/tiny/alibi.json "
    "--set data.path=data/stdlib-2k": ({}, _LM),
    "python launch/pretrain.py --config configs/tiny/regular_gpt.json --run-dir runs/regular_gpt-seed0 "
    "--extend-to 600": ({"--extend-to 600": "--extend-to 6"}, _LM),
    "python eval/plan_scale.py --config configs/base.json --gpus-per-node 8 --gpu-memory-gb 80 --nodes 1": ({}, []),
    # the corpus configs/base.json reads (data.path=data/python-stdlib, vocab 8000), from a slice of the library
    "python data_prep/prepare.py --source python-stdlib --out data/python-stdlib":
        ({}, ["--max-bytes", "2000000", "--num-proc", "1"]),
    "python eval/extrapolate.py --runs runs/alibi-seed0 runs/regular_gpt-seed0 --data data/stdlib-2k "
    "--out results/lm": ({}, ["--lengths", "32,64", "--tokens", "2048", "--no-progress"]),
    "python eval/extrapolate.py --runs runs/regular_gpt-seed0 --data data/stdlib-2k --out results/lm "
    "--depth-policy train": ({}, ["--lengths", "32,64", "--tokens", "2048", "--no-progress"]),
    "python launch/generate.py runs/regular_gpt-seed0 --prompt 'def ' --max-new-tokens 200 --temperature 0.8 "
    "--top-k 50 --stream": ({"--max-new-tokens 200": "--max-new-tokens 20"}, []),
    "python launch/export.py runs/regular_gpt-seed0": ({}, []),
    "python launch/export.py runs/regular_gpt-seed0 --format hf --out exports/rgpt": ({}, []),
    shlex.join(["python", "-c", HF_SNIPPET]): ({"max_new_tokens=40": "max_new_tokens=8"}, []),
    "python launch/submit.py --configs configs/tiny/regular_gpt.json configs/tiny/alibi.json --seeds 0 1 "
    "--data data/stdlib-2k --nodes 1 --gpus-per-node 2 --cpus-per-task 8 --dry-run": ({}, []),
    "python eval/formal.py sweep --profile paper --tasks parity_check --seeds 0 --out runs/formal-paper "
    "--tables-dir runs --slurm --gpus-per-task 1 --array-throttle 64 --dry-run": ({}, []),
    "python eval/lm_comparison.py --study v4 --slurm --out runs/lm-v4 --dry-run": ({}, []),
    "python launch/train_formal.py --config configs/formal/parity_check.json --set model.d_model=64 "
    "--set train.steps=1000 --set train.lr=1e-3 --run-dir runs/parity-c2 --time-to-solve":
        ({"train.steps=1000": "train.steps=20", "--time-to-solve": "--time-to-solve 10"},
         ["--set", "logging.progress=false"]),
    "python eval/formal.py sweep --profile quick --tasks parity_check --models regular_gpt_c2 --seeds 0 "
    "--out runs/formal": ({}, _FORMAL_SWEEP),
    "python eval/formal.py aggregate --runs runs/formal --profile quick --out-dir runs/formal": ({}, []),
    "python eval/formal.py by-depth --runs runs/formal/parity_check/regular_gpt_c2/seed0_lr0.001": ({}, []),
}

SKIPPED: dict[str, str] = {
    "make demo": "four trainings of 200 steps and their evaluation, about 5 minutes on 2 cores after the install; "
                 "its stages are tests/test_lm_comparison.py's",
    "make test": "the suite this test is part of",
    "deepspeed launch/pretrain.py --config configs/base.json": "the KERPLE-scale run (12 × 768, T = 512, 50,000 "
                                                               "steps, bf16) is for GPUs: on CPU it takes minutes "
                                                               "a step; "
                                                               "the deepspeed launcher is run by tests/test_pretrain.py",
}


def readme_commands(text: str) -> list[str]:
    """The commands of every fenced block, in order: continuation lines joined, a transcript's ``$ `` prompt and
    its output dropped, comments and blank lines left out; each normalised as shlex tokens joined by spaces (quotes
    as shlex.join writes them)."""
    commands = []
    for language, block in re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.M | re.S):
        if language.strip() == "python":  # a Python snippet: one command, the whole block as a program
            commands.append(shlex.join(["python", "-c", block]))
            continue
        lines = block.replace("\\\n", " ").splitlines()
        if lines and lines[0].startswith("$ "):  # a transcript: the command, then what it printed
            lines = [lines[0][2:]]
        for line in lines:
            tokens = shlex.split(line, comments=True)
            if tokens:
                commands.append(shlex.join(tokens))
    return commands


def test_every_readme_command_is_run_or_skipped_with_a_reason() -> None:
    commands = readme_commands(README.read_text())
    assert len(commands) == len(set(commands)) and len(commands) >= len(TINY)
    unknown = [c for c in commands if c not in TINY and c not in SKIPPED]
    stale = [c for c in [*TINY, *SKIPPED] if c not in commands]
    assert not unknown, f"README.md commands with no entry in tests/test_readme.py (TINY or SKIPPED): {unknown}"
    assert not stale, f"entries of tests/test_readme.py that README.md no longer has: {stale}"
    assert not set(TINY) & set(SKIPPED)


def _tiny(command: str) -> str:
    replacements, extra = TINY[command]
    for old, new in replacements.items():
        assert old in command, (command, old)
        command = command.replace(old, new)
    return command + "".join(" " + shlex.quote(a) for a in extra)


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_readme_commands_run_as_written_at_tiny_sizes(tmp_path: Path) -> None:
    """A fresh clone's layout, the venv activated, README.md's commands in order: each exits 0."""
    for name in ("configs", "launch", "eval", "data_prep"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    outputs = {}
    for command in readme_commands(README.read_text()):
        if command in SKIPPED:
            continue
        line = _tiny(command)
        proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        outputs[command] = proc.stdout + proc.stderr
    train = outputs["python launch/pretrain.py --config configs/tiny/regular_gpt.json --set data.path=data/stdlib-2k"]
    assert "steps 0 → 4 of 4" in train and "next: python eval/extrapolate.py --runs runs/regular_gpt-seed0" in train
    extended = next(out for c, out in outputs.items() if "--extend-to" in c)
    assert "data.path=data/stdlib-2k (the run's" in extended and "steps 4 → 6 of 6" in extended
    assert "| RegularGPT" in outputs[next(c for c in outputs if c.endswith("--depth-policy train"))]
    assert "tokens/s" in outputs[next(c for c in outputs if c.startswith("python launch/generate.py"))]
    # the solve line states what the run's check rows say: the first step at >= 0.99, else the best score
    solve = next(c for c in outputs if "--time-to-solve" in c)
    run_dir = tmp_path / solve.split("--run-dir ")[1].split()[0]
    rows = [json.loads(x) for x in (run_dir / "time_to_solve.jsonl").read_text().splitlines()]
    first = next((r for r in rows if r["score"] >= 0.99), None)
    best = max(rows, key=lambda r: r["score"])
    expected = (f"time to solve: step {first['step']}, " if first else
                f"not solved: best check score {best['score']:.3f} at step {best['step']} (< 0.99 on ")
    assert rows and expected in outputs[solve], (expected, outputs[solve][-500:])
