"""The language-model trainer's checkpoints and RNG streams: what a checkpoint holds besides DeepSpeed's own files,
writing one on every rank, and resuming from the newest intact one.

A checkpoint ``global_step<N>/`` is DeepSpeed's ``save_checkpoint`` (weights, optimizer, LR schedule) with
:meth:`Checkpoints.client_state` as its client state, plus per-rank RNG files, ``trainer_state.json`` and checksums
(:mod:`regulargpt.run_directory`); ``latest`` is moved to it only after every rank has written its part. Rank 0
decides what every rank does with the run directory (:func:`rank0_decides`), so the ranks never disagree::

    ckpt = Checkpoints(cfg, run_dir, engine, scheduler, sampler, param_names, fingerprint, rank, world, dist)
    resumed = ckpt.resume()            # None, or (step, tokens, bad_steps) loaded from the newest intact checkpoint
    ckpt.save(step, tokens, bad_steps)

RNG streams: the initial weights come from ``train.seed`` (:func:`seed_all`), then each rank draws from its own
stream (:func:`seed_rank_stream`, dropout); a resume on as many processes restores the saved streams, one on another
number re-derives them from (seed, rank, step).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt import run_directory as rd
from regulargpt.config import Config, config_to_dict
from regulargpt.errors import TrainError
from regulargpt.write_errors import explain_write_error
from regulargpt.train.engine import lr_factor
from regulargpt.train.lm_data import check_same_data

__all__ = ["Checkpoints", "rank0_decides", "refuse_other_data", "seed_all", "seed_rank_stream"]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_rank_stream(seed: int, rank: int, step: int = 0) -> None:
    """This rank's RNG stream from `step` on: seed_all(seed · 1,000,003 + 7,919 · (rank + 1) + 104,729 · step)."""
    seed_all(seed * 1_000_003 + 7919 * (rank + 1) + 104_729 * step)


def refuse_other_data(run_dir: Path, fingerprint: dict[str, Any]) -> None:
    """Before a restarted run rewrites its config.resolved.json (which records where the data is now): the
    TrainError of :func:`~regulargpt.train.lm_data.check_same_data` when the newest checkpoint trained on other
    data, so a refused resume leaves the run's record alone. Nothing for a fresh run or an unreadable checkpoint
    (:meth:`Checkpoints.resume` picks an intact one and compares again)."""
    try:
        step = rd.latest_step(run_dir)
        state = rd.read_trainer_state(run_dir, step) if step is not None else {}
    except TrainError:
        return
    if isinstance(state.get("data"), dict):
        check_same_data(run_dir, state["data"], fingerprint)


def rank0_decides(decide: Callable[[], Any], rank: int, world: int, dist: Any) -> Any:
    """Run `decide` on rank 0 and hand its result to every rank; a TrainError it raises is raised on all."""
    choice: list[Any] = [None, None]
    if rank == 0:
        try:
            choice = [decide(), None]
        except TrainError as err:
            choice = [None, str(err)]
    if world > 1:
        dist.broadcast_object_list(choice, src=0)
    if choice[1] is not None:
        raise TrainError(choice[1])
    return choice[0]


class Checkpoints:
    """Save and resume the run in `run_dir` for one rank of `world` (every rank calls both)."""

    def __init__(self, cfg: Config, run_dir: Path, engine: Any, scheduler: Any, sampler: Any,
                 param_names: list[list[str]], fingerprint: dict[str, Any], rank: int, world: int, dist: Any) -> None:
        self.cfg, self.run_dir, self.engine, self.scheduler, self.sampler = cfg, run_dir, engine, scheduler, sampler
        self.param_names, self.fingerprint = param_names, fingerprint
        self.rank, self.world, self.dist = rank, world, dist

    def client_state(self, step: int, tokens: int, bad_steps: int) -> dict[str, Any]:
        return {"step": step, "tokens": tokens, "world_size": self.world, "bad_steps": bad_steps,
                "config": config_to_dict(self.cfg),  # the run's config, should config.resolved.json be lost
                "sampler": self.sampler.settings(),
                "data": self.fingerprint, "zero_stage": self.cfg.train.zero_stage,
                "precision": self.cfg.train.precision, "param_names": self.param_names,
                **rd.trainer_state_fields(self.cfg.train.batch_size, self.cfg.train.grad_accum, self.world)}

    def save(self, step: int, tokens: int, bad_steps: int, protect: int | None = None) -> None:
        """Write checkpoint `step` (every rank); pruning to ``keep_last`` spares `protect` (the last good one)."""
        tag = f"global_step{step}"
        state = self.client_state(step, tokens, bad_steps)
        with explain_write_error(self.run_dir / tag, "the checkpoint", rd.checkpoint_bytes(self.run_dir)):
            self.engine.save_checkpoint(str(self.run_dir), tag=tag, client_state=state, save_latest=False)
            rd.save_rng(self.run_dir, step, self.rank)
            if self.rank == 0:
                rd.write_trainer_state(self.run_dir, step, state)
        self.dist.barrier()
        if self.rank == 0:
            with explain_write_error(self.run_dir / tag, "the checkpoint", rd.checkpoint_bytes(self.run_dir)):
                rd.write_checksums(self.run_dir, step)
                rd.mark_latest(self.run_dir, step)
            rd.prune_checkpoints(self.run_dir, self.cfg.train.keep_last, protect)
            rd.drop_universal(self.run_dir)  # a world-size change's conversion, if any: superseded now
        self.dist.barrier()

    def _decides(self, decide: Callable[[], Any]) -> Any:
        return rank0_decides(decide, self.rank, self.world, self.dist)

    def _resume_point(self) -> int | None:
        """Rank 0 picks the checkpoint (rd.resume_step: may set a corrupt one aside) and tells the other ranks."""

        def pick() -> int | None:
            step, warnings_ = rd.resume_step(self.run_dir)
            for text in warnings_:
                print(f"warning: {text}", file=sys.stderr, flush=True)
            return step

        return self._decides(pick)

    def resume(self) -> tuple[int, int, int] | None:
        """Load the newest intact checkpoint into the engine, the sampler and the RNG streams → (step, tokens,
        bad_steps), or None when there is none. TrainError for other data or a checkpoint that does not fit."""
        step = self._resume_point()
        if step is None:
            return None
        state = rd.read_trainer_state(self.run_dir, step)
        check_same_data(self.run_dir, state["data"], self.fingerprint)
        load_dir, universal = self.run_dir, False
        if state["world_size"] != self.world and rd.needs_universal(self.run_dir, step):  # re-cut the partitions
            load_dir, universal = Path(self._decides(lambda: str(rd.to_universal(self.run_dir, step)))), True
        try:
            with rd.safe_loading():
                self.engine._config.load_universal_checkpoint = universal  # read by load_checkpoint only
                path, _ = self.engine.load_checkpoint(str(load_dir), tag=f"global_step{step}",
                                                      load_optimizer_states=True, load_lr_scheduler_states=True)
        except (RuntimeError, KeyError, ValueError, OSError) as err:  # intact files that do not fit this model
            raise TrainError(f"{self.run_dir}/global_step{step}: DeepSpeed cannot load this checkpoint into the "
                             f"configured model ({type(err).__name__}: {str(err)[:300]})") from None
        finally:
            self.engine._config.load_universal_checkpoint = False
        if path is None:
            raise TrainError(f"{self.run_dir}/global_step{step}: DeepSpeed could not load this checkpoint")
        if state["world_size"] == self.world:
            self.sampler.check_resume(state["sampler"])
            rd.load_rng(self.run_dir, step, self.rank)
        else:  # another data order and per-rank RNG streams, both a function of (seed, step, rank) for this world
            self.sampler.check_resume({**state["sampler"], "world_size": self.world})
            seed_rank_stream(self.cfg.train.seed, self.rank, step)
        # The optimizer's settings come back as the checkpoint saved them: take this config's instead (for an
        # ordinary resume the same values; an extended run re-planned the schedule, and --allow-changed may have
        # changed train.lr, beta1, beta2 or eps). LambdaLR multiplies base_lrs by the schedule at every step.
        t = self.cfg.train
        self.scheduler.base_lrs = [t.lr] * len(self.scheduler.optimizer.param_groups)
        for group in self.scheduler.optimizer.param_groups:
            group.update(initial_lr=t.lr, lr=t.lr * lr_factor(step, self.cfg), betas=(t.beta1, t.beta2), eps=t.eps)
        return state["step"], state["tokens"], state.get("bad_steps", 0)
