"""Run configs and model files written before each trainer had its own ``data``/``eval`` sections still load, as
the right class and with the same recipe and variant ids (fixtures/README.md says what wrote each file)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import tiny_cfg

from regulargpt.checkpoint import load_model_file, save_model_file
from regulargpt.config import (
    Config,
    ConfigError,
    FormalConfig,
    FormalDataConfig,
    ModelConfig,
    config_from_saved,
    formal_config_from_saved,
    load_config,
    load_config_dict,
)
from regulargpt.evaluation.length_sweep import run_variant, variant_id
from regulargpt.experiments.formal_sweep import recipe_id
from regulargpt.model import build_model
from regulargpt.run_directory import saved_config
from regulargpt.run_directory.lm_resume import check_or_write_config

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_a_language_model_run_config_with_the_formal_keys_at_their_defaults_loads_as_before() -> None:
    saved = _fixture("lm_config_resolved_v2.json")
    assert saved["data"]["task"] == "" and saved["eval"]["max_length"] == 500  # the old shared layout
    cfg = config_from_saved(saved, "v2")
    # eval.tokens: the run recorded 0 (the whole split), the default when it was written; today's default is a budget
    assert cfg.eval.tokens == 0
    assert cfg == load_config(ROOT / "configs/tiny/regular_gpt.json", ["train.seed=1", "eval.tokens=0"])
    assert variant_id(run_variant(cfg, {})) == "5b82bef05c94"  # as the old code computed it


def test_a_formal_key_with_another_value_in_a_language_model_config_is_a_clear_error() -> None:
    saved = _fixture("lm_config_resolved_v2.json")
    for section, key, value in (("data", "task", "parity_check"), ("eval", "samples_per_length", 64)):
        bad = {**saved, section: {**saved[section], key: value}}
        with pytest.raises(ConfigError, match=rf"^run/config.json: {section}\.{key}: {value!r} is a formal-language "
                                              rf"setting, not allowed in a language-model config"):
            config_from_saved(bad, "run/config.json")
    with pytest.raises(ConfigError, match=r"run/config.json: data\.tsk: unknown key"):  # not an old key: unknown
        config_from_saved({**saved, "data": {**saved["data"], "tsk": ""}}, "run/config.json")


def test_a_language_model_run_saved_in_the_old_layout_resumes_and_is_rewritten(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "lm_config_resolved_v2.json", tmp_path / "config.resolved.json")
    cfg = load_config(ROOT / "configs/tiny/regular_gpt.json", ["train.seed=1"])
    assert check_or_write_config(tmp_path, cfg) is None
    assert "task" not in json.loads((tmp_path / "config.resolved.json").read_text())["data"]
    assert saved_config(tmp_path, ConfigError) == cfg


def test_a_language_model_file_in_the_old_layout_loads_as_a_config() -> None:
    cfg, model, meta = load_model_file(FIXTURES / "lm_model_v2.pt")
    assert type(cfg) is Config and (cfg.data.path, cfg.data.seq_len, cfg.eval.lengths) == ("data/tiny", 32, [32, 64])
    assert variant_id(run_variant(cfg, meta)) == "aec234c0157f"  # as the old code computed it
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 64)


def test_formal_run_configs_in_both_old_layouts_load_with_their_recipe() -> None:
    v2 = formal_config_from_saved(_fixture("formal_config_resolved_v2.json"), "v2")  # shared data/eval sections
    assert v2 == tiny_cfg(steps=2) and recipe_id(v2) == "599610be35e3"  # as the old code computed it
    v1 = formal_config_from_saved(_fixture("formal_config_resolved_v1.json"), "v1")  # a whole language-model Config
    assert (v1.data.task, v1.eval.samples_per_length, recipe_id(v1)) == ("parity_check", 64, "61cdcbe16e01")
    assert saved_config(FIXTURES, ConfigError, read=formal_config_from_saved) is None  # (no config.resolved.json)


@pytest.mark.parametrize("name,architecture", [("formal_model_v2.pt", "regular_gpt"), ("formal_model_v1.pt", "lstm")])
def test_formal_model_files_in_both_old_layouts_load_as_a_formal_config(name: str, architecture: str) -> None:
    cfg, model, _ = load_model_file(FIXTURES / name)
    assert type(cfg) is FormalConfig and cfg.model.architecture == architecture and cfg.data.task == "parity_check"
    assert (cfg.data.max_length, cfg.eval.max_length, cfg.eval.score_min_length) == (6, 12, 7)
    assert model(torch.zeros(3, 9, dtype=torch.long)).shape == (3, 2)


@pytest.mark.parametrize("architecture,extra", [("transformer", {"position": "alibi"}), ("rnn", {}), ("lstm", {})])
def test_a_model_file_comes_back_with_its_trainers_config_class(tmp_path: Path, architecture: str, extra: dict) -> None:
    model_cfg = ModelConfig(architecture=architecture, head="classifier", vocab_size=3, num_classes=5, d_model=8,
                            n_heads=2, n_layers=1, **extra)
    formal = FormalConfig(model=model_cfg, data=FormalDataConfig(task="cycle_navigation"))
    save_model_file(tmp_path / "formal.pt", formal, build_model(model_cfg))
    assert load_model_file(tmp_path / "formal.pt")[0] == formal
    lm = load_config_dict({"model": {"architecture": "transformer", "vocab_size": 7, "d_model": 8, "n_heads": 2,
                                     "n_layers": 1}})
    save_model_file(tmp_path / "lm.pt", lm, build_model(lm.model))
    assert load_model_file(tmp_path / "lm.pt")[0] == lm
