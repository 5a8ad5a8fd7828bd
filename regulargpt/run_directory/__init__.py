"""The run directory: one component both trainers use for its layout, resume checks and checkpoints.

It imports nothing from training (tests/test_imports.py), so evaluation and the experiment tables read run
directories through it too (file names in :mod:`regulargpt.run_directory.layout`, saved configs with
:func:`saved_config`). Layout::

    runs/tiny-regular_gpt-seed0/       language-model trainer (regulargpt.train.loop)
      config.resolved.json               the full config this run trains with (compared on resume; every
                                         checkpoint's trainer_state.json holds a copy: lm_resume.run_config)
      changes.jsonl                      settings changed on resume with --allow-changed, and from which step
      metrics.jsonl                      one JSON object per logged step (regulargpt.train.metrics_log)
      global_step100/ … global_step200/  DeepSpeed checkpoints + trainer_state.json, rng_rank<r>.pt, checksums.json
      latest                             "global_step200": the checkpoint a resume starts from
      universal/global_step200/          after a resume on another number of processes, until its first
                                         checkpoint: DeepSpeed's universal conversion (:mod:`.world_change`)
      trainer.lock                       while a trainer runs: its host, pid, job id, heartbeat (:mod:`.lock`)
      model.pt                           consolidated fp32 model (regulargpt.checkpoint format), written at the end
      zero_to_fp32.py                    copied there by DeepSpeed (ZeRO ≥ 1); launch/export.py does the same job

    runs/parity-c2/                    formal trainer (regulargpt.train.formal_trainer)
      config.resolved.json               as above
      metrics.jsonl                      {"step", "loss", "acc", "lr", "length", "seconds"} per logged step
      time_to_solve.jsonl                with a time-to-solve check: {"step", "seconds", "cpu_seconds", "score"}
      ckpt.pt, ckpt.prev.pt              the newest checkpoint and the one before it
      model.pt                           the final model, written last

Policy, the same for both trainers (one module each):

- **config on resume** (:mod:`.config_check`): a run directory is resumed by rerunning its command; the saved
  config must equal the new one except for the keys the trainer declares resume-free (a :class:`ResumePolicy`:
  language model :data:`~.lm_resume.RESUME_FREE`, formal ``logging.*``). Anything else is an error naming the file
  and every differing key with both values.
- **metrics on resume** (:mod:`.metrics`): rows logged after the checkpoint's step, and a torn last line, are
  dropped before appending, so a resumed run's file equals an uninterrupted one's.
- **checkpoint fallback** (:mod:`.fallback`): a checkpoint that fails its check is kept as ``<name>.corrupt`` and
  the newest older intact one used, with one warning naming both.

The checkpoint formats differ and stay apart: DeepSpeed folders sealed by checksums, rotated by ``keep_last``
(:mod:`.checkpoints`, language model) and one ``torch.save`` file rotated to ``ckpt.prev.pt`` (:mod:`.ckpt_file`,
formal). Every ``torch.load`` of a language-model checkpoint runs under :func:`safe_loading` (``weights_only=True``).
Consolidating a checkpoint into ``model.pt`` is :mod:`regulargpt.train.export`.
"""

from regulargpt.run_directory.checkpoints import (
    checkpoint_bytes,
    checkpoint_config,
    checkpoint_steps,
    latest_step,
    load_rng,
    mark_latest,
    prune_checkpoints,
    read_trainer_state,
    remove_partial_checkpoints,
    resume_step,
    rng_state,
    save_rng,
    verify_checkpoint,
    write_checksums,
    write_trainer_state,
)
from regulargpt.run_directory.ckpt_file import ckpt_config, load_ckpt, save_ckpt
from regulargpt.run_directory.config_check import (
    ResumePolicy,
    check_config_unchanged,
    config_changes,
    saved_config,
)
from regulargpt.run_directory.fallback import fallback_warning, set_aside
from regulargpt.run_directory.lm_resume import (
    ALLOW_CHANGED_KEYS,
    CHANGES_FILE,
    RESUME_FREE,
    RESUME_FREE_KEYS,
    check_allow_changed,
    check_or_write_config,
    default_run_dir,
    extension_config,
    run_config,
    set_aside_export,
    with_saved_data_path,
)
from regulargpt.run_directory.lock import RunDirLock, describe_holder, lock_holder
from regulargpt.run_directory.metrics import open_for_append, truncate_after
from regulargpt.run_directory.safe_load import safe_loading
from regulargpt.run_directory.world_change import (
    drop_universal,
    grad_accum_for,
    needs_universal,
    to_universal,
    trainer_state_fields,
)

__all__ = [
    # layout and the language model's resume policy
    "default_run_dir", "RESUME_FREE", "RESUME_FREE_KEYS", "check_or_write_config", "extension_config",
    "set_aside_export", "with_saved_data_path", "run_config", "ALLOW_CHANGED_KEYS", "CHANGES_FILE",
    "check_allow_changed",
    # config on resume, metrics on resume, fallback: shared by both trainers
    "ResumePolicy", "saved_config", "config_changes", "check_config_unchanged", "truncate_after", "open_for_append",
    "set_aside", "fallback_warning",
    # language-model checkpoints
    "checkpoint_steps", "latest_step", "checkpoint_config", "checkpoint_bytes", "write_trainer_state", "read_trainer_state", "write_checksums",
    "verify_checkpoint", "resume_step", "mark_latest", "prune_checkpoints", "remove_partial_checkpoints",
    "rng_state", "save_rng", "load_rng", "safe_loading",
    # one trainer per run directory
    "RunDirLock", "lock_holder", "describe_holder",
    # resuming on another number of processes
    "grad_accum_for", "needs_universal", "to_universal", "drop_universal", "trainer_state_fields",
    # formal checkpoints
    "save_ckpt", "load_ckpt", "ckpt_config",
]
