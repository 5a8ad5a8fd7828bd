"""Refusing a run that cannot fit in memory before anything is allocated or written.

A sequence length or micro-batch far beyond the machine (``data.seq_len=131000``, ``train.batch_size=1000000``)
used to crash with an out-of-memory traceback in the first step. :func:`check_memory` estimates the per-process
bytes of one step with the scale planner (:func:`regulargpt.scale_plan.estimate`: model states under the run's
ZeRO stage, DeepSpeed's buffers, and the activations autograd saves, with or without activation checkpointing)
and compares them with what the device has free: ``torch.cuda.mem_get_info`` on a GPU, or the host's available
memory (``psutil``) shared by the processes of this node on a CPU. A run that needs more is refused with both
figures and what to change, e.g.::

    data.seq_len=32 × train.batch_size=1000000 needs about 542.0 GB per process for one training step (model
    states and buffers 0.0 GB, activations 542.0 GB; regulargpt/scale_plan.py), but this machine has 20.6 GB of
    memory available; lower data.seq_len or train.batch_size (train.grad_accum keeps the global batch), or set
    train.activation_checkpointing=true (231.2 GB). Nothing was written

(the tiny config with the test sizes of tests/test_faults.py, on this 24 GB machine).

The estimate is a lower bound (allocator slack and temporaries are not counted), so a run that passes can still
run out; one that fails cannot fit. Architectures the planner does not model (RoPE, T5, KERPLE baselines) are not
checked.
"""

from __future__ import annotations

import psutil
import torch

from regulargpt.config import Config, ConfigError
from regulargpt.errors import TrainError
from regulargpt.scale_plan import estimate

__all__ = ["check_memory"]


def _available(device: torch.device, local_world: int) -> tuple[float, str]:
    """(bytes this process may use, where) on `device`."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free), f"{torch.cuda.get_device_name(device)} has {free / 1e9:.1f} GB free"
    free = psutil.virtual_memory().available / max(1, local_world)
    share = f" (its share for {local_world} processes on this node)" if local_world > 1 else ""
    return free, f"this machine has {free / 1e9:.1f} GB of memory available{share}"


def check_memory(cfg: Config, world: int, local_world: int, device: torch.device) -> None:
    """TrainError when one training step of `cfg` on `world` processes needs more memory than `device` has free
    (module docstring); nothing for a run that fits or an architecture the planner does not model."""
    t = cfg.train
    try:
        plan = estimate(cfg, world, t.zero_stage, device=device.type)
    except ConfigError:
        return
    need = plan.total(t.activation_checkpointing)
    free, where = _available(device, local_world)
    if need <= free:
        return
    acts = plan.activations_ac if t.activation_checkpointing else plan.activations
    states = need - acts
    hint = ("" if t.activation_checkpointing else
            f", or set train.activation_checkpointing=true ({plan.total(True) / 1e9:.1f} GB)")
    raise TrainError(f"data.seq_len={cfg.data.seq_len} × train.batch_size={t.batch_size} needs about "
                     f"{need / 1e9:.1f} GB per process for one training step (model states and buffers "
                     f"{states / 1e9:.1f} GB, activations {acts / 1e9:.1f} GB; regulargpt/scale_plan.py), but {where}; "
                     f"lower data.seq_len or train.batch_size (train.grad_accum keeps the global batch){hint}. "
                     f"Nothing was written")
