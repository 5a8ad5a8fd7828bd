"""The language-model training loop: data → DeepSpeed engine → metrics, validation, checkpoints, export.

One call, :func:`train`, does a whole run (or the rest of one)::

    prepare env → check data (vocab, tokenizer, val length) → init_distributed (gloo on CPU) → build model
    (seeded) → DeepSpeed engine → resume from the newest intact checkpoint if the run dir has one →
    for step in start..steps:
        grad_accum × (batch(step, micro_step) → forward → loss → engine.backward → engine.step)
        log / validate / checkpoint; stop cleanly on SIGTERM/SIGUSR1
    → final checkpoint → model.pt (rank 0)

Batches come from ``WindowSampler(train split, T, micro-batch, seed, rank, world)``, seeded by
(seed, step, micro_step, rank): a resumed run sees exactly the batches the uninterrupted run would have seen (on
the same number of processes; on another, ``grad_accum`` keeps the global batch: run_directory/world_change.py).
Validation uses the first ``eval_batches`` batches of a sampler over the val split with the same seed: the same
fixed windows at every evaluation, averaged over ranks. A mixture (``data.paths``) draws from a
:class:`~regulargpt.data.mixture.MixtureSampler`, records its corpora in ``mixture.json``, logs ``sequences/<corpus>``
(drawn so far, all ranks) at every record and ``val_loss/<corpus>`` at every validation, ``val_loss`` being their
weighted mean.

Preemption: the first SIGTERM, SIGUSR1 or SIGINT (Ctrl-C), or the end of the launcher that started this rank
(:mod:`regulargpt.train.stopping`: DeepSpeed's runner or torchrun killed), asks for a stop; after the current step
every rank agrees (one all-reduce per step), a checkpoint is written and :func:`train` returns
``{"preempted": True, ...}`` with the reason and the command that resumes (the launcher exits 0). A second signal
arriving more than 2 s after the first exits at once (copies of one signal delivered by both SLURM and torchrun, or
by a terminal and the deepspeed launcher, within that window count as one).

Host reads: one per optimizer step, none per micro-batch. The micro-batch losses are summed on the device; after the
last backward, the count of non-finite losses (and, for ZeRO-0 fp32, a non-finite gradient norm) and the two stop
requests are all-reduced on the device and :class:`~regulargpt.train.engine.GuardedAdamW` reads them once, with the
DeepSpeed wrapper's global-norm verdict, when DeepSpeed calls its ``step`` (the trainer reads them itself when a
DeepSpeed wrapper skipped that call). Losses and gradient norms stay on the device
(:class:`~regulargpt.train.step_stats.StepStats`) until a metrics record, every ``train.log_every`` steps, reads
their window means. (DeepSpeed's own wrappers add reads of their own: overflow checks; see docs/PERFORMANCE.md.)

Modules: this one sets up the run and drives it (:class:`_Trainer`: steps, records, validation and checkpoint
cadence, preemption, export; :func:`train`: the process around it); :mod:`regulargpt.train.lm_step` runs one
optimizer step and validation, :mod:`regulargpt.train.lm_checkpoint` saves and resumes (and seeds the RNG
streams), :mod:`regulargpt.train.lm_data` opens and checks the data.

Non-finite steps: a step with a non-finite loss on any rank, or a non-finite global gradient norm, runs its
backward passes to the boundary and :class:`~regulargpt.train.engine.GuardedAdamW` discards the update; the verdict
is all-reduced, so all ranks agree. Weights and optimizer state are unchanged, the LR schedule still advances with
the step count, a warning is printed and the step is logged with ``"skipped": true``. More than ``train.max_bad_steps`` skipped steps in a run (the
count is kept in checkpoints) stop it with a TrainError, and so does a recorded loss above
``train.divergence_factor`` × ln V or a non-finite loss at the last step (:mod:`regulargpt.train.divergence`):
checkpoints saved after the weights went bad are set aside, ``latest`` names the last good one, and the message
ends with the launch command plus ``--set train.lr=… --allow-changed train.lr``, which resumes from it.

The ``lr`` of a metrics record is the rate the optimizer applied at that step (its param group's, read before
the step), so a resume with ``--allow-changed train.lr`` shows in the record from the step it took effect.
"""

from __future__ import annotations

import dataclasses
import json
import logging as _stdlib_logging
import math
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from regulargpt.config import Config
from regulargpt.files import atomic_write_text
from regulargpt.peak import PEAK_ENV, cached_peak, datasheet_peak
from regulargpt.run_directory.layout import MIXTURE_FILE, MODEL_FILE
from regulargpt import run_directory as rd
from regulargpt.train.export import export_model
from regulargpt.train.engine import (
    TrainError,
    build_engine,
    check_compile,
    check_deepspeed_config,
    check_precision,
    prepare_process_env,
    skip_shm_build,
)
from regulargpt.train.divergence import DivergenceGuard, keep_good_checkpoints, lower_lr_command
from regulargpt.train.lm_checkpoint import (
    Checkpoints,
    rank0_decides,
    refuse_other_data,
    seed_all,
    seed_rank_stream,
)
from regulargpt.train.lm_data import (
    Corpus,
    data_fingerprint,
    mixture_record,
    open_corpora,
    open_data,
    train_sampler,
    val_samplers,
)
from regulargpt.train.lm_step import StepRunner
from regulargpt.train.memory_check import check_memory
from regulargpt.train.step_stats import StepStats
from regulargpt.train.metrics_log import MetricsLog
from regulargpt.train.stopping import Lifeline, StopRequest, launch_command, orphaned

__all__ = ["open_data", "train"]  # open_data lives in lm_data; re-exported for its callers


class _Trainer:
    def __init__(self, cfg: Config, run_dir: Path, env: dict[str, int], corpora: list[Corpus],
                 lock: rd.RunDirLock, allow: frozenset[str], command: str) -> None:
        import deepspeed
        import torch.distributed as dist

        from regulargpt.model import build_model

        self.cfg, self.run_dir, self.dist, self.command = cfg, run_dir, dist, command
        self.rank, self.world, self.corpora = env["rank"], env["world_size"], corpora
        fingerprint = data_fingerprint(corpora)
        if torch.cuda.is_available():
            torch.cuda.set_device(env["local_rank"])
        deepspeed.init_distributed(dist_backend=None if torch.cuda.is_available() else "gloo", verbose=False,
                                   timeout=timedelta(seconds=cfg.train.dist_timeout_s))
        took_over = self._rank0_decides(lock.acquire)  # before anything is written in the run directory
        if took_over:
            print(f"note: {took_over}", file=sys.stderr, flush=True)
        self._rank0_decides(lambda: refuse_other_data(run_dir, fingerprint))  # before the config is rewritten
        rd.check_or_write_config(run_dir, cfg, write=False, allow=allow)  # a changed config: before the batch plan
        accum, note = self._rank0_decides(lambda: rd.grad_accum_for(run_dir, cfg, self.world))  # or refuse
        if note:
            if self.rank == 0:
                print(f"note: {note}", file=sys.stderr, flush=True)
            cfg = self.cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, grad_accum=accum))
        extending = rd.check_or_write_config(run_dir, cfg, write=self.rank == 0, allow=allow)
        if extending is not None and self.rank == 0:
            rd.set_aside_export(run_dir, extending)
        run_dir.mkdir(parents=True, exist_ok=True)

        t = cfg.train
        device = torch.device("cuda", env["local_rank"]) if torch.cuda.is_available() else torch.device("cpu")
        self.peak, self.peak_source = self._shared_peak(str(device))
        self.datasheet = datasheet_peak(str(device), cfg.train.precision)  # (FLOP/s, name) or None
        seed_all(t.seed)  # identical initial weights on every rank
        model = build_model(cfg.model)
        self.flops_per_token = model.flops_per_token(cfg.data.seq_len)
        self.num_parameters = model.num_parameters()
        self.engine, scheduler, param_names, optimizer = build_engine(cfg, model, self.world)
        self.device = self.engine.device
        seed_rank_stream(t.seed, self.rank)  # per-rank stream (dropout)

        sampler = train_sampler(corpora, cfg, self.rank, self.world)
        self.val_samplers = val_samplers(corpora, cfg, self.rank, self.world)
        self.steps = StepRunner(cfg, self.engine, optimizer, scheduler, sampler, self.val_samplers[0], self.rank,
                                self.world, dist)
        self.checkpoints = Checkpoints(cfg, run_dir, self.engine, scheduler, sampler, param_names, fingerprint,
                                       self.rank, self.world, dist)
        self.step, self.tokens, self.bad_steps = 0, 0, 0
        self.tokens_per_step = t.batch_size * t.grad_accum * cfg.data.seq_len * self.world
        resumed = self.checkpoints.resume()
        if resumed is not None:
            self.step, self.tokens, self.bad_steps = resumed
        if len(corpora) > 1 and self.rank == 0:  # the data accepted: where its folders are now, what they hold
            atomic_write_text(run_dir / MIXTURE_FILE, json.dumps(mixture_record(corpora), indent=2) + "\n")
        self.log = MetricsLog(cfg, run_dir, self.step, enabled=self.rank == 0)
        if len(corpora) > 1:
            self.log.message(f"{run_dir}: data: a mixture of " + ", ".join(
                f"{c.name} {c.weight:.1%} ({len(c.train):,} train tokens)" for c in corpora)
                + f"; recorded in {run_dir / MIXTURE_FILE}")
        self.guard = DivergenceGuard(t.divergence_factor, cfg.model.vocab_size, self.step)

    def _shared_peak(self, device: str) -> tuple[float, str]:
        """Rank 0 reads the per-machine peak (measured once, 3 s, while the other ranks wait) and sends it to all."""
        choice = [cached_peak(device, self.cfg.train.precision) if self.rank == 0 else None]
        if self.world > 1:
            self.dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def _mfu(self, tokens_per_s: float) -> dict[str, float]:
        """{"mfu": model FLOP/s over the datasheet peak (a GPU in regulargpt.peak.DATASHEET_PEAKS) or else the
        measured one, "mfu_measured": over the measured peak, when a datasheet peak was used}."""
        achieved = self.flops_per_token * tokens_per_s / self.world
        measured = self._mfu_measured(achieved)
        if self.datasheet is None:
            return {"mfu": measured}
        return {"mfu": achieved / self.datasheet[0], "mfu_measured": measured}

    def _mfu_measured(self, achieved: float) -> float:
        """Achieved FLOP/s per process over the measured peak, never above 1: a step faster than the peak raises
        this run's peak (the cache is left alone: flops_per_token is a model count, not a measurement)."""
        if achieved > self.peak:
            self.log.message(f"note: step {self.step}: {achieved / 1e9:.0f} GFLOP/s per process, above the peak "
                             f"{self.peak / 1e9:.0f} GFLOP/s ({self.peak_source}); using it as the peak from now on"
                             + (f" (check {PEAK_ENV})" if self.peak_source == PEAK_ENV else ""))
            self.peak, self.peak_source = achieved, f"raised at step {self.step} to the rate this run reached"
        return achieved / self.peak

    def _rank0_decides(self, decide: Callable[[], Any]) -> Any:
        return rank0_decides(decide, self.rank, self.world, self.dist)

    def save(self) -> None:
        """Checkpoint ``global_step<step>`` (every rank; regulargpt.train.lm_checkpoint)."""
        self.steps.drawn(self.corpora)  # a mixture's checkpoint keeps its per-corpus counts (sampler settings)
        self.checkpoints.save(self.step, self.tokens, self.bad_steps, protect=self.guard.good_step)
        self.guard.saved(self.step)

    def train_step(self, stop: StopRequest) -> tuple[torch.Tensor, bool, bool, bool]:
        """The next optimizer step (regulargpt.train.lm_step.StepRunner.run)."""
        return self.steps.run(self.step, stop)

    def _stop(self, what: str) -> None:
        """Stop a run whose weights went bad: rank 0 sets aside the checkpoints saved since the last good one
        (regulargpt.train.divergence); every rank raises the same TrainError, ending in the command that resumes
        from that checkpoint at a lower rate."""
        kept = self._rank0_decides(lambda: keep_good_checkpoints(self.run_dir, self.guard.good_step))
        raise TrainError(f"step {self.step}: {what}; stopped without saving: {kept}. Continue at a lower learning "
                         f"rate with: {lower_lr_command(self.command, self.cfg.train.lr)}")

    def _skip(self, loss: float) -> None:
        """Count a skipped step; warn, or stop the run when there were more than train.max_bad_steps."""
        t = self.cfg.train
        self.bad_steps += 1
        if self.bad_steps > t.max_bad_steps:
            self._stop(f"{self.bad_steps} steps skipped for a non-finite loss or gradient, more than "
                       f"train.max_bad_steps={t.max_bad_steps}")
        self.log.message(f"warning: step {self.step}: non-finite loss or gradient (loss {loss}); step skipped, "
                         f"weights unchanged ({self.bad_steps}/{t.max_bad_steps} allowed)")

    def run(self, stop: StopRequest) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        if self.step == 0:
            self.log.message(f"{self.run_dir}: {self.num_parameters:,} parameters, {self.world} process(es), ZeRO "
                             f"{t.zero_stage}, {t.precision}, {self.tokens_per_step:,} tokens/step; peak "
                             f"{self.peak / 1e9:.0f} GFLOP/s per process ({self.peak_source})"
                             + ("; torch.compile on" if t.compile else "")
                             + (" (ZeRO-3: in fragments, split at every module by DeepSpeed's parameter hooks)"
                                if t.compile and t.zero_stage == 3 else "")
                             + (f"; mfu against the datasheet peak {self.datasheet[0] / 1e12:.0f} TFLOP/s of the "
                                f"{self.datasheet[1]}, mfu_measured against the measured one" if self.datasheet
                                else ""))
        elif self.step >= t.steps:
            self.log.message(f"{self.run_dir}: already finished at step {self.step}/{t.steps}; nothing to train")
        elif t.extended_from and self.step == t.extended_from[-1]:
            rewarm = round(t.warmup_fraction * (t.steps - self.step))
            plan = ("LR constant" if t.schedule == "constant" else
                    f"LR from {t.min_lr_ratio * t.lr:.3g} back to {t.lr:.3g} over {rewarm} step(s), then cosine to "
                    f"{t.min_lr_ratio * t.lr:.3g} at step {t.steps}")
            self.log.message(f"{self.run_dir}: extending the finished run from step {self.step} to {t.steps} ({plan})")
        else:
            self.log.message(f"{self.run_dir}: resuming at step {self.step}/{t.steps}")
        self.engine.train()
        preempted, start_step, run_start = False, self.step, time.perf_counter()
        window_time, window_tokens, last_val, last_loss = 0.0, 0, None, None
        stats = StepStats(self.device)
        while self.step < t.steps:
            start = time.perf_counter()
            lr = self.steps.optimizer.param_groups[0]["lr"]  # the rate this step applies (a float: no device sync)
            loss, skipped, signalled, orphaned = self.train_step(stop)
            self.step += 1
            self.tokens += self.tokens_per_step
            stats.add(loss, None if skipped else self.steps.grad_norm)
            final = self.step == t.steps
            do_eval = final or (t.eval_every > 0 and self.step % t.eval_every == 0)
            record = do_eval or skipped or self.step % t.log_every == 0  # the same steps on every rank
            if record:
                loss, grad_norm = stats.read(self.steps.reduce, self.world)  # waits for the device: inside the window
                last_loss = loss
                self.guard.seen(loss)  # vouches for the checkpoints saved before this window
            window_time += time.perf_counter() - start
            window_tokens += self.tokens_per_step
            self.log.advance()
            if record and self.guard.diverged(loss):
                self._stop(f"{self.guard.describe(loss)}: the run diverged")
            if skipped:
                self._skip(loss)
            if final and not math.isfinite(loss):
                self._stop(f"the last step's loss is {loss} (non-finite), so no model.pt is written")
            if record:
                rec: dict[str, Any] = {"step": self.step, "loss": loss, "lr": lr}
                if grad_norm is not None:
                    rec["grad_norm"] = grad_norm
                if skipped:
                    rec["skipped"] = True
                tps = window_tokens / max(window_time, 1e-9)
                rec.update(tokens=self.tokens, tokens_per_s=tps, **self._mfu(tps),
                           elapsed_s=round(time.perf_counter() - run_start, 3))
                if self.device.type == "cuda":  # the caching allocator's own count: no device sync
                    rec["max_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
                window_time, window_tokens = 0.0, 0
                rec.update(self.steps.drawn(self.corpora))
                if do_eval:
                    rec.update(self.steps.validate_corpora(self.corpora, self.val_samplers))
                    last_val = rec["val_loss"]
                self.log.record(rec)
            if (signalled or orphaned) and not final:
                stop.reason = stop.reason or ("a signal to another rank" if signalled else "another rank's launcher "
                                              "is gone")
                self.log.message(f"step {self.step}: stop requested ({stop.reason}); saving a checkpoint and exiting")
                self.save()
                preempted = True
                break
            if final or (t.save_every > 0 and self.step % t.save_every == 0):
                self.save()
        finished_before = start_step >= t.steps and rd.latest_step(self.run_dir) == t.steps
        if not preempted and rd.latest_step(self.run_dir) != t.steps:
            self.save()  # a run resumed after its last step but before its final save
        if not preempted and self.rank == 0 and not (finished_before and (self.run_dir / MODEL_FILE).is_file()):
            path = export_model(self.run_dir, t.steps)
            self.log.message(f"wrote {path}")
        self.dist.barrier()
        self.log.close()
        self.dist.destroy_process_group()
        return {"step": self.step, "tokens": self.tokens, "preempted": preempted, "val_loss": last_val,
                "run_dir": str(self.run_dir), "loss": last_loss, "start_step": start_step,
                "seconds": time.perf_counter() - run_start, "tokens_per_step": self.tokens_per_step}


def _is_collective_failure(err: RuntimeError) -> bool:
    """True for the errors a collective raises when another rank died (its sockets closed) or stopped answering (the
    timeout): gloo and NCCL raise RuntimeError or torch.distributed.DistError subclasses naming the backend."""
    import torch.distributed as dist

    text = str(err)
    return isinstance(err, dist.DistError) or any(k in text for k in ("gloo", "NCCL", "Connection reset", "timed out",
                                                                       "Timed out"))


def _peer_lost_message(err: RuntimeError, step: int, run_dir: Path, timeout_s: float, resume: str) -> str:
    """One line: what happened, where the last checkpoint is, how to continue, e.g. ``lost contact with another rank
    at step 7 (… Connection reset by peer …): a node or rank died or hung (train.dist_timeout_s=1800); the newest
    checkpoint is runs/x/global_step6; rerun to resume: torchrun …``."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    latest = rd.latest_step(run_dir)
    where = f"the newest checkpoint is {run_dir / f'global_step{latest}'}" if latest else "no checkpoint was written"
    return (f"lost contact with another rank at step {step + 1} ({first[:300]}): a node or rank died or hung "
            f"(train.dist_timeout_s={timeout_s:g}); {where}; rerun to resume: {resume}")


def _quiet_deepspeed() -> None:
    from deepspeed.utils import logger

    logger.setLevel(_stdlib_logging.WARNING)


def train(cfg: Config, run_dir: str | Path, parent_at_start: int | None = None,
          allow_changed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Train (or resume) the run in `run_dir` → summary {"step", "tokens", "preempted", "val_loss", "run_dir",
    "loss", "start_step", "seconds", "tokens_per_step", "stop_reason", "resume_command"} (``loss``/``val_loss``:
    the last of this invocation, None if none ran; the last two say why a preempted run stopped and how to continue
    it).

    `parent_at_start`: the parent pid when the process started (``os.getppid()`` before the slow imports): a rank
    whose launcher has ended since stops here with a TrainError instead of training on, unwatched.
    `allow_changed`: config keys a resume may change (``--allow-changed``; run_directory.ALLOW_CHANGED_KEYS)."""
    # DeepSpeed ZeRO-3 calls these collectives every step; torch 2.13 warns on each call.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` "
                            r"is deprecated", category=FutureWarning)
    env = prepare_process_env()
    check_precision(cfg)
    check_compile(cfg)
    corpora = open_corpora(cfg)  # before the DeepSpeed import: a bad data folder is reported in a second
    if orphaned(parent_at_start):
        raise TrainError(f"the launcher that started this process (pid {parent_at_start}) has ended; nothing was "
                         f"trained (rerun the launcher's command to resume {run_dir})")
    stop = StopRequest()
    stop.install()
    lifeline = Lifeline(stop.request)  # under a launcher: its end is a stop request too
    resume = launch_command(lifeline.start())
    lock = rd.RunDirLock(Path(run_dir))  # taken by rank 0 in _Trainer, released on every way out of here
    try:
        import deepspeed  # noqa: F401  (after prepare_process_env: DS_ACCELERATOR must be set first)

        skip_shm_build()
        _quiet_deepspeed()
        check_deepspeed_config(cfg, env["world_size"])  # before the run directory is written
        device = (torch.device("cuda", env["local_rank"]) if torch.cuda.is_available() else torch.device("cpu"))
        check_memory(cfg, env["world_size"], env["local_world_size"], device)  # a step that cannot fit: refused now
        trainer = _Trainer(cfg, Path(run_dir), env, corpora, lock, allow_changed, resume)
        try:
            summary = trainer.run(stop)
        except RuntimeError as err:
            if env["world_size"] == 1 or not _is_collective_failure(err):
                raise
            raise TrainError(_peer_lost_message(err, trainer.step, Path(run_dir), cfg.train.dist_timeout_s,
                                                resume)) from err
        return {**summary, "stop_reason": stop.reason, "resume_command": resume}
    finally:
        lock.release()
        lifeline.stop()
        stop.uninstall()
