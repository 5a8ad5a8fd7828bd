"""Gradient accumulation is exact: one step with grad_accum = 4 (4 micro-batches of 2 sequences) moves every
weight as one step on the 8 sequences at once, under ZeRO 0 and ZeRO 1 (tests/grad_accum_step.py, one subprocess:
DeepSpeed on CPU, world size 1). A step that fed one micro-batch 4 times, or scaled the loss wrongly, moves the
weights by a different update of the same size (AdamW's first step is ±lr per weight). The same run pins the
reported gradient norm (the accumulated one equals the 4x batch's), the validation loss (against
F.cross_entropy computed in the script) and a NaN step (skipped, no weight moved, the LR schedule still advanced)."""

from __future__ import annotations

import json
import subprocess
import sys
from helpers import ROOT, run_env


def test_grad_accum_4_equals_one_step_on_the_4x_batch_under_zero_0_and_1() -> None:
    env = run_env()  # keeps the PYTHONPATH beside an image (the campaign's deps: deepspeed, psutil)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "grad_accum_step.py"), "0", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["stage"] for line in lines] == [0, 1]
    for line in lines:
        assert line["max_update"] > 1e-3, line  # the step moved the weights
        assert line["max_diff"] < 1e-6, line  # fp32 rounding only: 1.7e-8 measured
        assert abs(line["loss_accum"] - line["loss_whole"]) < 1e-6, line
        assert line["grad_norm_whole"] > 0 and abs(line["grad_norm_accum"] / line["grad_norm_whole"] - 1) < 1e-5, line
        assert abs(line["val"] - line["val_expected"]) < 1e-5, line  # the mean over eval_batches × 1 rank
        assert line["nan_skipped"] and line["nan_moved"] == 0.0 and line["nan_lr_steps"] == 1, line
