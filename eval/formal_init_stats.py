"""Why a RegularGPT parity seed can stay at chance: what the network computes at initialisation, per init scheme.

For each scheme (`model.init` = normal: N(0, 0.02) everywhere, the GPT recipe; fan_in: Haiku's truncated normal with
std 1/sqrt(fan_in), the authors' recipe) and seed, on a batch of parity strings of the longest training length,
it measures at step 0 (no training):

* branch / residual: ||Attn(x)|| / ||x|| and ||FFN(h)|| / ||h|| at the first layer application (post-LN blocks
  compute LN(x + Attn(x)), so a small ratio means every layer is close to the identity on its residual stream);
* attention logit std: the spread of q·k/sqrt(d_head) + r inside the C-key windows (0 means uniform averaging);
* first-bit influence: the median |Δ logit| of the class logits when the FIRST input bit is flipped (parity of a
  string depends on every bit; at 0 the output cannot tell the label and gradients towards it are second order);
* gradient norm: the global gradient norm of the cross-entropy at initialisation.

Example:
    python eval/formal_init_stats.py --config configs/formal/parity_check.json --seeds 0 1 2 \\
        --set model.d_model=64 --out results/formal/init_diagnosis.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from regulargpt.cli import non_negative_int, positive_int, run  # noqa: E402
from regulargpt.config import FormalConfig, load_config  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.model import build_model  # noqa: E402
from regulargpt.provenance import provenance, report_head  # noqa: E402
from regulargpt.train.formal_trainer import formal_task, seed_stream  # noqa: E402


def init_stats(config: str, sets: list[str], scheme: str, seed: int, length: int, batch: int) -> dict[str, float]:
    cfg = load_config(config, [*sets, f"model.init={scheme}", f"train.seed={seed}"], FormalConfig)
    task = formal_task(cfg)
    torch.manual_seed(seed_stream(seed, 0))  # the trainer's initialisation stream
    model = build_model(cfg.model)
    inputs, labels = task.sample(batch, length, torch.Generator().manual_seed(1234))  # (B, T), (B,)
    layer = model.stack.sublayers[0].layer
    x = model.embed(inputs)  # (B, T, d)
    logits_std = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # dilation 1, window C
        c = cfg.model.chunk_size
        r = model.stack.sublayers[0].rel_bias
        for j in range(c):  # logits of query m against key m − j (m >= j)
            s = (q[:, :, j:] * k[:, :, : q.shape[2] - j]).sum(-1) / q.shape[-1] ** 0.5 + r[:, j, None]
            logits_std.append(s.flatten())
        return torch.zeros_like(v)

    layer.attention(x, attend)
    attn = layer.attention(x, lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    h = layer.norm1(x + attn)
    ffn = layer.feed_forward(h)
    flipped = inputs.clone()
    flipped[:, 0] = 1 - flipped[:, 0]
    out = model(inputs)
    loss = F.cross_entropy(out, labels)
    loss.backward()
    grad = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None))
    with torch.no_grad():
        influence = (model(flipped) - out).abs().max(-1).values.median()
    return {"attn_ratio": float(attn.norm() / x.norm()), "ffn_ratio": float(ffn.norm() / h.norm()),
            "logit_std": float(torch.cat(logits_std).std()), "influence": float(influence), "grad": float(grad)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/formal/parity_check.json", help="formal task config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--seeds", nargs="+", type=non_negative_int, default=[0, 1, 2], help="seeds (default 0 1 2)")
    p.add_argument("--length", type=positive_int, default=40, help="string length (default 40, the longest trained)")
    p.add_argument("--batch", type=positive_int, default=128, help="strings (default 128)")
    p.add_argument("--out", help="markdown report to write (default: print only)")
    args = p.parse_args(argv)
    lines = ["| init | seed | attn / residual | FFN / residual | attention logit std | first-bit influence "
             "(median abs Δ logit) | gradient norm |", "|---|---:|---:|---:|---:|---:|---:|"]
    for scheme in ("normal", "fan_in"):
        for seed in args.seeds:
            s = init_stats(args.config, args.set, scheme, seed, args.length, args.batch)
            lines.append(f"| {scheme} | {seed} | {s['attn_ratio']:.4f} | {s['ffn_ratio']:.4f} | {s['logit_std']:.4f} | "
                         f"{s['influence']:.2e} | {s['grad']:.2e} |")
    print("\n".join(lines))
    if args.out:
        command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
        prov = provenance(command)
        head = [*report_head("RegularGPT at initialisation, per init scheme", prov),
                "Measured at step 0 (no training) on parity strings of length "
                f"{args.length}; see the script's docstring for each column.", ""]
        atomic_write_text(Path(args.out), "\n".join(head + lines) + "\n")
    return 0


if __name__ == "__main__":
    run(main)
