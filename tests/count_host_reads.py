"""Run one tiny training in this process and count the host reads of tensor values per optimizer step.

    python tests/count_host_reads.py DATA_DIR RUN_DIR --set train.grad_accum=4 ...   → one JSON line
    {"per_step": {"1": 1, ...}, "ours": {"1": 1, ...}, "log_steps": [4, 8], "where": {"regulargpt/...:320 tolist": 1}}

A host read is a call of Tensor.item / tolist / cpu / numpy / __float__ / __int__ / __bool__ made by code outside
torch.optim (whose single-tensor AdamW reads its CPU step counters): on a GPU each one waits for the device.
"ours" counts those made by regulargpt's own code (the rest are DeepSpeed's). Reads are attributed to the
optimizer step whose ``train_step`` ran last (step 0: the setup before the first step); "where" lists the callers
in the first step from 2 on that logs nothing.
Used by tests/test_host_syncs.py; the trainer is the real one (DeepSpeed, gloo, one process).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regulargpt.config import load_config  # noqa: E402
from regulargpt.train import loop  # noqa: E402

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
counts: collections.Counter[int] = collections.Counter()
ours: collections.Counter[int] = collections.Counter()  # the reads made by regulargpt's own code
where: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
current = [0]


def _counted(name: str):
    original = getattr(torch.Tensor, name)

    def read(self, *args, **kwargs):
        frame = sys._getframe(1)
        caller = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/optim/" not in caller:
            counts[current[0]] += 1
            ours[current[0]] += "/regulargpt/" in caller
            where[current[0]][f"{caller.split('/site-packages/')[-1].removeprefix(str(ROOT) + '/')}:{frame.f_lineno} {name}"] += 1
        return original(self, *args, **kwargs)

    return read


def main(argv: list[str]) -> None:
    data_dir, run_dir, *rest = argv
    sets = [rest[i + 1] for i in range(0, len(rest), 2) if rest[i] == "--set"]
    cfg = load_config(ROOT / "configs/tiny/regular_gpt.json", [f"data.path={data_dir}", *sets])
    original_step = loop._Trainer.train_step

    def train_step(self, *args, **kwargs):
        current[0] = self.step + 1
        return original_step(self, *args, **kwargs)

    loop._Trainer.train_step = train_step
    for name in READS:
        setattr(torch.Tensor, name, _counted(name))
    loop.train(cfg, run_dir)
    t = cfg.train
    log_steps = [s for s in range(1, t.steps + 1) if s % t.log_every == 0 or s == t.steps
                 or (t.eval_every > 0 and s % t.eval_every == 0) or (t.save_every > 0 and s % t.save_every == 0)]
    steps = range(1, t.steps + 1)
    print(json.dumps({"per_step": {str(s): counts[s] for s in steps}, "ours": {str(s): ours[s] for s in steps},
                      "log_steps": log_steps,
                      "where": dict(where[next((s for s in range(2, t.steps + 1) if s not in log_steps), 1)])}))


if __name__ == "__main__":
    main(sys.argv[1:])
