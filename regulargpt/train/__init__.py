"""Language-model pretraining with DeepSpeed (ZeRO 0–3, bf16/fp32, CPU via gloo or CUDA via nccl).

    from regulargpt.config import load_config
    from regulargpt.train import train
    train(load_config("configs/tiny/regular_gpt.json", ["data.path=data/tiny"]), "runs/tiny")

Modules: ``process_env`` (every launcher's ranks: torchrun, deepspeed, srun, mpirun, plain python), ``engine``
(DeepSpeed config, optimizer with skippable updates + LR schedule, activation checkpointing, compile), ``loop`` (the
training loop: records, validation and checkpoint cadence, preemption), ``lm_step`` (one optimizer step with one
host read, non-finite steps, validation), ``lm_checkpoint`` (save, resume, RNG streams), ``lm_data`` (the data
splits, checked), ``run_directory`` (the run directory both trainers share: layout,
config and metrics on resume, checkpoints with fallback, keep-last-k, extension, the trainer lock, resuming on
another number of processes), ``export`` (ZeRO consolidation → model.pt), ``metrics_log`` (console, metrics.jsonl, wandb),
``formal_trainer`` (the formal-language trainer), ``faults`` (test-only NaN injection), ``stopping`` (signals and
the launcher's end → checkpoint and exit), ``lm_loss`` (the fp32 cross-entropy in chunks), ``step_stats`` (losses
and gradient norms summed on the device between records). Nothing here imports DeepSpeed or wandb at import time. See
docs/RELIABILITY.md.
"""

from regulargpt.train.engine import TrainError, deepspeed_config, lr_factor
from regulargpt.train.loop import train
from regulargpt.train.export import export_model
from regulargpt.run_directory import default_run_dir

__all__ = ["TrainError", "deepspeed_config", "lr_factor", "train", "default_run_dir", "export_model"]
