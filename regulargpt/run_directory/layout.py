"""The file names inside a run directory: one home that the trainers write and evaluation and reports read.

Neither side imports the other for them (evaluation must not import training)::

    RUN/config.resolved.json   CONFIG_FILE      the resolved config (both trainers; compared on resume)
    RUN/metrics.jsonl          METRICS_FILE     training metrics rows
    RUN/model.pt               MODEL_FILE       the final model (regulargpt.checkpoint format)
    RUN/mixture.json           MIXTURE_FILE     an LM run on a mixture (data.paths): its corpora, weights, fingerprints
    RUN/trainer.lock           LOCK_FILE        the running LM trainer's lock record (regulargpt.run_directory.lock)
    RUN/ckpt.pt                CKPT_FILE        formal trainer: model + optimizer + step + RNG states
    RUN/ckpt.prev.pt           PREV_CKPT_FILE   formal trainer: the checkpoint before it
    RUN/time_to_solve.jsonl    SOLVE_FILE       formal trainer with a time-to-solve check
    RUN/sweep.json             SWEEP_FILE       formal sweep: profile, grid point, eval lengths and sample count
    RUN/range.jsonl            RANGE_FILE       formal sweep: range evaluation at the training task options
"""

from __future__ import annotations

__all__ = ["CKPT_FILE", "CONFIG_FILE", "LOCK_FILE", "METRICS_FILE", "MIXTURE_FILE", "MODEL_FILE", "PREV_CKPT_FILE",
           "RANGE_FILE", "SOLVE_FILE", "SWEEP_FILE"]

CONFIG_FILE = "config.resolved.json"
METRICS_FILE = "metrics.jsonl"
MODEL_FILE = "model.pt"
LOCK_FILE = "trainer.lock"
CKPT_FILE = "ckpt.pt"
PREV_CKPT_FILE = "ckpt.prev.pt"
SOLVE_FILE = "time_to_solve.jsonl"
SWEEP_FILE = "sweep.json"
RANGE_FILE = "range.jsonl"
MIXTURE_FILE = "mixture.json"
