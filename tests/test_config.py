"""Strict JSON configs: inheritance, overrides, round trip, and errors that name file, key, value and what is allowed."""

import json
from pathlib import Path

import pytest

from regulargpt.config import (
    Config,
    ConfigError,
    FormalConfig,
    config_to_dict,
    load_config,
    load_config_dict,
    save_config,
)

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_every_shipped_config_loads_and_round_trips(tmp_path):
    # every complete config: formal/base.json, formal/models/ and formal/profiles/ are fragments merged by the sweep
    fragments = {"base.json", "models", "profiles"}
    files = sorted(f for f in (ROOT / "configs").rglob("*.json")
                   if not (f.parent.name == "formal" and f.name in fragments) and f.parent.name not in fragments)
    assert len(files) >= 16 + 19
    for f in files:
        if f.parent.name == "campaign" and f.name == "plan.json":  # the campaign's plan, not a training config
            from regulargpt.experiments.gpu_campaign.plan import load_plan_config
            assert load_plan_config(f).models, f
            continue
        kind = FormalConfig if f.parent.name == "formal" else Config  # one config class per trainer
        cfg = load_config(f, kind=kind)
        again = load_config_dict(json.loads(json.dumps(config_to_dict(cfg))), kind=kind)
        assert again == cfg, f
        save_config(cfg, tmp_path / "resolved.json")
        assert load_config(tmp_path / "resolved.json", kind=kind) == cfg


def test_extends_merges_recursively_and_overrides_convert_types(tmp_path):
    _write(tmp_path / "base.json", {"model": {"d_model": 64, "n_heads": 4}, "train": {"lr": 0.001}})
    child = _write(tmp_path / "child.json", {"extends": "base.json", "model": {"chunk_size": 3}})
    cfg = load_config(child, ["model.thickness=2", "train.lr=3e-4", "eval.lengths=64,128", "logging.wandb=false",
                              "model.pad=mask", "train.zero_stage=2", "deepspeed.zero_optimization={\"stage\": 2}"])
    assert (cfg.model.d_model, cfg.model.chunk_size, cfg.model.thickness, cfg.model.pad) == (64, 3, 2, "mask")
    assert cfg.train.lr == 3e-4 and cfg.eval.lengths == [64, 128] and cfg.logging.wandb is False
    for text in ("[64,128]", "[64, 128]", " [64,128] "):  # JSON's list syntax too
        assert load_config(child, [f"eval.lengths={text}"]).eval.lengths == [64, 128]
    with pytest.raises(ConfigError, match=r"eval.lengths=\[64,: cannot convert"):
        load_config(child, ["eval.lengths=[64,"])
    assert cfg.deepspeed == {"zero_optimization": {"stage": 2}}
    formal = load_config(ROOT / "configs/formal/dyck_2.json", ["data.task_options={\"n\": 3}", "eval.max_length=90"],
                         FormalConfig)
    assert formal.data.task_options == {"n": 3} and formal.eval.max_length == 90


@pytest.mark.parametrize(
    "body,pattern",
    [
        ({"model": {"chunk_sise": 4}}, r"model\.chunk_sise: unknown key; did you mean 'chunk_size'\?"),
        ({"modle": {}}, r"modle: unknown section; did you mean 'model'\?"),
        ({"model": {"d_model": "64"}}, r"model\.d_model: '64' has the wrong type; expected an integer"),
        ({"model": {"d_model": 64.0}}, r"model\.d_model: 64\.0 has the wrong type"),
        ({"model": {"chunk_size": 1}}, r"model\.chunk_size: 1 is not allowed; expected an integer >= 2"),
        ({"model": {"thickness": 0}}, r"model\.thickness: 0 is not allowed; expected an integer >= 1"),
        ({"model": {"d_model": 30, "n_heads": 4}}, r"model\.d_model: 30 is not allowed; expected a multiple of n_heads=4"),
        ({"model": {"architecture": "transformer", "position": "alibii"}}, r"model\.position: 'alibii' has the wrong type; expected one of 'none', 'sinusoidal'"),
        ({"model": {"pad": True}}, r"model\.pad: True has the wrong type; expected one of 'learned', 'mask'"),
        ({"train": {"zero_stage": 4}}, r"train\.zero_stage: 4 is not allowed; expected one of 0, 1, 2, 3"),
        ({"eval": {"lengths": [512, 0]}}, r"eval\.lengths"),
        ({"model": {"architecture": "regular_gpt", "position": "alibi"}}, r"model\.position: 'alibi' is not allowed"),
        ({"model": {"head": "classifier"}}, r"model\.num_classes: 0 is not allowed"),
        ({"model": {"head": "classifier", "num_classes": 2}}, r"model\.head: 'classifier' is not allowed; expected "
                                                             r"'lm' .*FormalConfig"),
        ({"train": {"lr": float("nan")}}, r"train\.lr: nan is not allowed; expected a finite number"),
        ({"train": {"eps": -1e-8}}, r"train\.eps: -1e-08 is not allowed; expected a number > 0"),
        ({"train": {"dist_timeout_s": 0}}, r"train\.dist_timeout_s: 0\.0 is not allowed; expected a number > 0"),
        ({"train": {"compile": "yes"}}, r"train\.compile: 'yes'"),
        ({"train": {"beta1": 1.0}}, r"train\.beta1: 1\.0 is not allowed; expected a number in \[0, 1\)"),
        ({"train": {"precision": "bf16"}, "deepspeed": {"bf16": {"enabled": False}}},
         r"deepspeed\.bf16\.enabled: False contradicts train\.precision='bf16'"),
        ({"deepspeed": {"gradient_accumulation_steps": 4}}, r"deepspeed\.gradient_accumulation_steps: 4 contradicts "
                                                            r"train\.grad_accum=1"),
        ({"deepspeed": {"scheduler": {"type": "WarmupLR"}}}, r"deepspeed\.scheduler: .* is not allowed; the LR schedule"),
    ],
)
def test_bad_values_name_file_key_value_and_allowed(tmp_path, body, pattern):
    path = _write(tmp_path / "bad.json", body)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_malformed_json_reports_line_and_column(tmp_path):
    path = _write(tmp_path / "broken.json", '{\n  "model": {"d_model": 64,}\n}')
    with pytest.raises(ConfigError, match=r"broken\.json: malformed JSON at line 2, column 27"):
        load_config(path)


@pytest.mark.parametrize("body, key, lines", [
    # the two cases: a whole section twice (the second one silently replaced the first), a key twice
    ('{"extends": "%s",\n "train": {"steps": 5},\n "train": {"lr": 5.0}}', "train", (2, 3)),
    ('{"extends": "%s",\n "train": {"lr": 0.001,\n\n           "lr": 10.0}}', "train.lr", (2, 4)),
    ('{"extends": "%s",\n "deepspeed": {"zero_optimization": {"stage": 0,\n  "stage": 0}}}',
     "deepspeed.zero_optimization.stage", (2, 3)),
])
def test_duplicate_keys_are_refused_naming_file_key_path_and_both_lines(tmp_path, body, key, lines):
    path = _write(tmp_path / "dup.json", body % (ROOT / "configs/tiny/regular_gpt.json"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: duplicate key {key} (lines {lines[0]} and {lines[1]}); each key may "
                               f"appear once")


def test_duplicate_keys_are_refused_in_a_parent_config_and_in_a_set_json_value(tmp_path):
    parent = _write(tmp_path / "parent.json", '{"model": {"d_model": 64},\n"model": {"d_model": 32}}')
    child = _write(tmp_path / "child.json", {"extends": "parent.json"})
    with pytest.raises(ConfigError, match=r"parent\.json: duplicate key model \(lines 1 and 2\)"):
        load_config(child)
    base = ROOT / "configs/tiny/regular_gpt.json"
    with pytest.raises(ConfigError, match=r"duplicate key zero_optimization \(lines 1 and 1\)"):
        load_config(base, ['deepspeed.zero_optimization={"zero_optimization": 1, "zero_optimization": 2}'])
    with pytest.raises(ConfigError, match=r"duplicate key stage \(lines 1 and 1\)"):
        load_config(base, ['deepspeed.zero_optimization={"stage": 0, "stage": 1}'])


def test_missing_file_and_extends_cycle(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.json")
    _write(tmp_path / "a.json", {"extends": "b.json"})
    _write(tmp_path / "b.json", {"extends": "a.json"})
    with pytest.raises(ConfigError, match="'extends' cycle"):
        load_config(tmp_path / "a.json")


def test_formal_score_lengths_must_lie_inside_the_evaluated_range(tmp_path):
    """A score over lengths score_min_length..max_length with score_min_length > max_length averages nothing."""
    path = _write(tmp_path / "f.json", {"model": {"head": "classifier", "num_classes": 2},
                                        "eval": {"max_length": 40, "score_min_length": 41}})
    with pytest.raises(ConfigError, match=r"f\.json: eval\.score_min_length: 41 is not allowed; expected <= "
                                          r"max_length=40"):
        load_config(path, kind=FormalConfig)


@pytest.mark.parametrize(
    "kind,body,pattern",
    [
        (Config, {"data": {"task": "parity_check"}}, r"data\.task: unknown key; allowed keys: path, paths, seq_len"),
        (Config, {"data": {"max_length": 40}}, r"data\.max_length: unknown key"),
        (Config, {"eval": {"samples_per_length": 64}}, r"eval\.samples_per_length: unknown key"),
        (Config, {"eval": {"lenghts": [64]}}, r"eval\.lenghts: unknown key; did you mean 'lengths'\?"),
        (FormalConfig, {"data": {"seq_len": 40}}, r"data\.seq_len: unknown key"),
        (FormalConfig, {"data": {"max_lenght": 40}}, r"data\.max_lenght: unknown key; did you mean 'max_length'\?"),
        (FormalConfig, {"eval": {"lengths": [64]}}, r"eval\.lengths: unknown key"),
        (FormalConfig, {"eval": {"protocol": "sliding"}}, r"eval\.protocol: unknown key"),
    ],
)
def test_each_trainer_config_holds_only_its_own_data_and_eval_keys(tmp_path, kind, body, pattern):
    """`data` and `eval` are sections of both config classes, with each trainer's own fields: the other trainer's
    key is an unknown-key error naming the file, in a config file and in a --set override alike."""
    base = {"model": {"head": "classifier", "num_classes": 2}} if kind is FormalConfig else {}
    path = _write(tmp_path / "other.json", {**base, **body})
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(path, kind=kind)
    assert str(info.value).startswith(f"{path}: ")
    (section, values), = body.items()
    (key, value), = values.items()
    with pytest.raises(ConfigError, match=rf"--set {section}\.{key}=.*unknown key"):
        load_config(_write(tmp_path / "ok.json", base), [f"{section}.{key}={json.dumps(value).strip('[]')}"], kind)


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("model.chunk_size", r"expected KEY=VALUE"),
        ("model.chunk_size=two", r"cannot convert 'two' to an integer"),
        ("model.chunk_sise=2", r"did you mean 'chunk_size'"),
        ("modle.chunk_size=2", r"did you mean 'model'"),
        ("logging.wandb=maybe", r"cannot convert 'maybe' to true or false"),
    ],
)
def test_bad_overrides(tmp_path, override, pattern):
    path = _write(tmp_path / "ok.json", {})
    with pytest.raises(ConfigError, match=pattern):
        load_config(path, [override])


def test_base_config_depth_matches_twelve_layer_applications():
    """configs/base.json: RegularGPT's K·ceil(log_C 512) equals the baselines' 12 layers."""
    from regulargpt.model import adaptive_depth

    base = load_config(ROOT / "configs/base.json")
    assert base.model.thickness * adaptive_depth(base.data.seq_len, base.model.chunk_size) == 12
    assert load_config(ROOT / "configs/baselines/alibi.json").model.n_layers == 12


def test_an_invalid_config_object_cannot_exist() -> None:
    """Sections validate on construction (and so does dataclasses.replace, which constructs); the message names the
    section and key; a validated config cannot be mutated."""
    import dataclasses

    from regulargpt.config import Config, ModelConfig, TrainConfig

    with pytest.raises(ConfigError, match=r"model.chunk_size: 1 is not allowed; expected an integer >= 2"):
        ModelConfig(chunk_size=1)
    cfg = load_config(ROOT / "configs/tiny/regular_gpt.json")
    with pytest.raises(ConfigError, match=r"train.lr: 0.0 is not allowed; expected a number > 0"):
        dataclasses.replace(cfg.train, lr=0.0)
    with pytest.raises(ConfigError, match=r"deepspeed.zero_optimization.stage: 3 contradicts train.zero_stage=0"):
        dataclasses.replace(cfg, deepspeed={"zero_optimization": {"stage": 3}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 0  # type: ignore[misc]
    assert Config(data=dataclasses.replace(cfg.data, seq_len=24)).model.train_length == 24  # resolved on construction
    with pytest.raises(ConfigError, match=r"x.json: train.batch_size: 0 is not allowed"):
        load_config_dict({"train": {"batch_size": 0}}, source="x.json")
    assert TrainConfig().batch_size == 32
