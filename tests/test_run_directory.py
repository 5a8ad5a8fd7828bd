"""The run-directory component both trainers share (regulargpt/run_directory/), on hand-made run folders.

Policy: a resumed run's saved config must equal the new one outside the trainer's resume-free keys, else one error
names the file and every differing key; metrics rows after the resume step and a torn last line are dropped; a
corrupt checkpoint is kept as <name>.corrupt[N].
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import tiny_cfg

from regulargpt.config import (
    Config,
    ConfigError,
    FormalConfig,
    config_to_dict,
    formal_config_from_saved,
    load_config,
    load_config_dict,
    save_config,
)
from regulargpt.files import TornLineWarning
from regulargpt.train import TrainError
from regulargpt import run_directory as rd
from regulargpt.train.formal_trainer import _RESUME_FREE as FORMAL_RESUME_FREE

ROOT = Path(__file__).resolve().parent.parent


def _lm_cfg(*sets: str) -> Config:
    return load_config(ROOT / "configs/tiny/regular_gpt.json", ["data.path=data/tiny", *sets])


def _resume(run_dir: Path, old: Config | FormalConfig, new: Config | FormalConfig, policy: rd.ResumePolicy,
            error: type[Exception]) -> None:
    save_config(old, run_dir / "config.resolved.json")
    read = formal_config_from_saved if isinstance(old, FormalConfig) else load_config_dict
    saved = rd.saved_config(run_dir, error, read=read)
    assert saved is not None
    rd.check_config_unchanged(run_dir, rd.config_changes(saved, new, policy), error)


def _with(cfg: Config | FormalConfig, **sections: dict) -> Config | FormalConfig:
    """`cfg` with some fields of some sections replaced."""
    raw = config_to_dict(cfg)
    for name, fields in sections.items():
        raw[name] = {**raw[name], **fields}
    return load_config_dict(raw, kind=type(cfg))


def test_language_model_policy_names_the_file_and_every_differing_key(tmp_path: Path) -> None:
    base = _lm_cfg()
    _resume(tmp_path, base, _lm_cfg("train.log_every=7", "data.path=/elsewhere", "logging.wandb=true",
                                    "eval.tokens=100"), rd.RESUME_FREE, TrainError)  # all resume-free: accepted
    with pytest.raises(TrainError) as err:
        _resume(tmp_path, base, _lm_cfg("train.lr=0.5", "model.d_model=64"), rd.RESUME_FREE, TrainError)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'config.resolved.json'}: ")
    assert re.search(r"\(model\.d_model: run has 128, now 64; train\.lr: run has 0\.001, now 0\.5\)", message)
    assert message.endswith("resume with the same config, or use another --run-dir")


def test_formal_policy_frees_only_logging(tmp_path: Path) -> None:
    base = tiny_cfg()
    _resume(tmp_path, base, _with(base, logging={"progress": True}), FORMAL_RESUME_FREE, ConfigError)
    with pytest.raises(ConfigError, match=r"config.resolved.json: .*\(train\.log_every: run has 1, now 5; "
                                          r"train\.lr: run has 0\.01, now 0\.005\)"):
        _resume(tmp_path, base, tiny_cfg(log_every=5, lr=5e-3), FORMAL_RESUME_FREE, ConfigError)
    assert rd.RESUME_FREE.is_free("train.log_every") and not FORMAL_RESUME_FREE.is_free("train.log_every")


def test_many_differences_are_counted_and_a_missing_config_is_a_new_run(tmp_path: Path) -> None:
    assert rd.saved_config(tmp_path, ConfigError) is None
    changes = {f"model.k{i}": (i, i + 1) for i in range(10)}
    with pytest.raises(ConfigError, match=r"model\.k7: run has 7, now 8; and 2 more\)"):
        rd.check_config_unchanged(tmp_path, changes, ConfigError)
    (tmp_path / "config.resolved.json").write_text("{not json")
    with pytest.raises(TrainError, match=r"config.resolved.json: malformed JSON .*use another --run-dir"):
        rd.saved_config(tmp_path, TrainError)


def test_metrics_truncation_drops_rows_after_the_resume_step_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (2, 4, 6, 8)) + '{"step": 1')
    with pytest.warns(TornLineWarning):
        rd.truncate_after(path, 5)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 4]
    with rd.open_for_append(path, 4) as handle:  # an exact resume leaves the file alone and appends after it
        handle.write(json.dumps({"step": 6}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 4, 6]
    rd.truncate_after(tmp_path / "missing.jsonl", 3)
    assert not (tmp_path / "missing.jsonl").exists()


def test_a_corrupt_checkpoint_is_kept_under_a_free_corrupt_name(tmp_path: Path) -> None:
    for _ in range(3):
        (tmp_path / "ckpt.pt").write_bytes(b"damaged")
        rd.set_aside(tmp_path / "ckpt.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt.corrupt", "ckpt.pt.corrupt1", "ckpt.pt.corrupt2"]
    text = rd.fallback_warning(tmp_path / "global_step9", "x is missing", tmp_path / "global_step9.corrupt",
                               "global_step6")
    assert text == (f"checkpoint {tmp_path}/global_step9 is corrupt: x is missing (kept as global_step9.corrupt); "
                    f"resuming from global_step6 instead, the newest intact one")
