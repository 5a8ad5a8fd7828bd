"""Training metrics: console progress, ``metrics.jsonl`` and (optionally) wandb. Rank 0 only.

``metrics.jsonl`` holds one JSON object per logged step, written before anything pretty::

    {"step": 20, "loss": 5.91, "lr": 0.001, "grad_norm": 0.84, "tokens": 40960, "tokens_per_s": 9120.4,
     "mfu": 0.031, "elapsed_s": 4.5}
    {"step": 100, ..., "val_loss": 5.02}          # val_loss when validation ran at that step
    {"step": 100, ..., "sequences/web": 2410, "sequences/code": 790, "val_loss/web": 5.3, "val_loss/code": 4.1}
                                                  # a mixture (data.paths): draws so far, per-corpus val losses

``loss`` and ``grad_norm`` are means over the steps since the previous record (and the ranks), ``tokens_per_s``
counts tokens of all ranks over those steps; ``mfu`` divides ``flops_per_token(T) × tokens_per_s`` by the peak
FLOP/s of all ranks: a GPU's datasheet peak where :func:`regulargpt.peak.datasheet_peak` knows it (then
``mfu_measured`` is against the measured one), else the measured peak (:func:`regulargpt.peak.cached_peak`, raised
to the achieved rate if a run ever goes faster, so it never exceeds 1).

wandb: only imported when ``logging.wandb`` is true. Without an API key (no ``WANDB_API_KEY``, no netrc entry for
api.wandb.ai) ``WANDB_MODE=offline`` is set, so the run is written under ``<run_dir>/wandb/`` for a later
``wandb sync`` and nothing waits on the network; an online start that fails falls back to offline.
"""

from __future__ import annotations

import json
import netrc
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from regulargpt.config import Config, config_to_dict
from regulargpt.files import atomic_write_text
from regulargpt.run_directory.layout import METRICS_FILE
from regulargpt.run_directory.metrics import open_for_append

__all__ = ["wandb_has_key", "MetricsLog"]


def wandb_has_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


class MetricsLog:
    """Rank-0 sink for step records: metrics.jsonl, console (tqdm bar or plain lines) and wandb."""

    def __init__(self, cfg: Config, run_dir: Path, start_step: int, enabled: bool) -> None:
        self.cfg, self.run_dir, self.enabled = cfg, run_dir, enabled
        self.path = run_dir / METRICS_FILE
        self.bar: Any = None
        self.wandb_run: Any = None
        if not enabled:
            return
        self.file = open_for_append(self.path, start_step)  # a resumed run drops the rows after its checkpoint
        if cfg.logging.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=cfg.train.steps, initial=start_step, desc=run_dir.name, unit="step",
                            dynamic_ncols=True, mininterval=1.0, file=sys.stderr)
        if cfg.logging.wandb:
            self.wandb_run = self._start_wandb()

    def _start_wandb(self) -> Any:
        if "WANDB_MODE" not in os.environ and not wandb_has_key():
            os.environ["WANDB_MODE"] = "offline"
        import wandb

        id_file = self.run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        atomic_write_text(id_file, run_id)
        kwargs: dict[str, Any] = {
            "project": self.cfg.logging.project, "name": self.cfg.logging.run_name or self.run_dir.name, "id": run_id,
            "resume": "allow", "dir": str(self.run_dir), "config": config_to_dict(self.cfg)}
        try:
            return wandb.init(settings=wandb.Settings(init_timeout=60), **kwargs)
        except Exception as err:  # network trouble: never let it stop training
            self.message(f"wandb online start failed ({type(err).__name__}: {err}); logging offline instead")
            os.environ["WANDB_MODE"] = "offline"
            return wandb.init(**kwargs)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def record(self, rec: dict[str, Any]) -> None:
        """Write one step record everywhere it goes."""
        if not self.enabled:
            return
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        short = {"loss": f"{rec['loss']:.4f}", "lr": f"{rec['lr']:.2e}", "tok/s": f"{rec['tokens_per_s']:.0f}",
                 "mfu": f"{100 * rec['mfu']:.1f}%"} if "loss" in rec else {}
        if "val_loss" in rec:
            short["val"] = f"{rec['val_loss']:.4f}"
        corpora = ", ".join(f"{k[9:]} {v:.4f}" for k, v in rec.items() if k.startswith("val_loss/"))  # a mixture
        per_corpus = f" (weighted mean of {corpora})" if corpora else ""
        if self.bar is not None:
            self.bar.set_postfix(short, refresh=False)
            if "val_loss" in rec:
                self.bar.write(f"step {rec['step']}: val_loss {rec['val_loss']:.4f}{per_corpus}", file=sys.stderr)
        else:
            print(f"step {rec['step']}/{self.cfg.train.steps} " + " ".join(f"{k} {v}" for k, v in short.items())
                  + per_corpus, file=sys.stderr, flush=True)
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in rec.items() if k != "step"}, step=rec["step"])

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        self.file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
