"""The v4 LM study (issue 41): its plan (C = 16 and 64 take two depth steps at T = 256; ALiBi-8 matches RegularGPT's
layer applications) and its four answers, computed from hand-built result rows and receptive fields and checked
against values worked out by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from regulargpt.config import load_config
from regulargpt.experiments.lm_comparison.plans import ROOT, V4, train_overrides
from regulargpt.experiments.lm_comparison.stages import receptive_field_dir
from regulargpt.experiments.lm_comparison.v4_report import v4_sections
from regulargpt.model import adaptive_depth


def test_v4_rows_are_the_papers_regime_at_t256() -> None:
    by_name = {m.name: m for m in V4.models}
    assert V4.train_length == 256 and V4.lengths == [256, 512, 1024, 2048, 4096, 8192]
    assert V4.train_tokens == 300 * 16 * 256  # 1,228,800 tokens, as v2-t256
    for name, chunk in (("rg_c16", 16), ("rg_c64", 64)):
        cfg = load_config(ROOT / "configs/tiny/regular_gpt.json",
                          [*by_name[name].sets, *train_overrides(V4, "python-stdlib", 0, by_name[name])])
        assert cfg.model.chunk_size == chunk and cfg.model.thickness == 4
        assert adaptive_depth(256, chunk) == 2  # 16^2 = 256; 64 < 256 <= 64^2
    alibi8 = load_config(ROOT / "configs/tiny/alibi.json", list(by_name["alibi_l8"].sets))
    assert alibi8.model.n_layers == 8 == 4 * 2  # K · L_train
    window = load_config(ROOT / "configs/tiny/rope.json", list(by_name["rope_w64"].sets))
    assert window.model.window == 64 and window.model.n_layers == 4
    assert sorted((m.name, s) for _, m, s in V4.trainings()) == sorted((n, s) for n in by_name for s in (0, 1))


def _row(run: str, length: int, ppl: float, policy: str | None = None) -> dict:
    return {"run": run, "dataset": "python-stdlib", "split": "test", "length": length, "protocol": "nonoverlapping",
            "stride": length, "tokens": 16384, "depth_policy": policy, "ppl": ppl, "model": run, "variant": run}


def test_the_four_answers_from_hand_built_rows(tmp_path: Path) -> None:
    plan = dataclasses.replace(V4, out=tmp_path)
    # ppl at (256, 8192) per (row, policy, seed)
    ppl = {("rg_c16", None, 0): (105.0, 104.0), ("rg_c16", None, 1): (110.0, 112.2),
           ("rg_c16", "train", 0): (105.0, 103.95), ("rg_c16", "train", 1): (110.0, 108.9),
           ("rg_c64", None, 0): (130.0, 140.0), ("rg_c64", None, 1): (126.0, 130.0),
           ("alibi", None, 0): (100.0, 99.0), ("alibi", None, 1): (100.0, 98.0),
           ("alibi_l8", None, 0): (90.0, 89.0), ("alibi_l8", None, 1): (88.0, 87.0)}
    rows = [_row(f"results/x/runs/python-stdlib/{name}-seed{seed}", L, value, policy)
            for (name, policy, seed), pair in ppl.items() for L, value in zip((256, 8192), pair)]
    (tmp_path / "python-stdlib").mkdir()
    (tmp_path / "python-stdlib" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, policy, reach in (("rg_c16", "train", (3, 12, 200)), ("rope_w64", "", (4, 30, 150))):
        folder = receptive_field_dir(plan, name, policy)
        folder.mkdir(parents=True)
        (folder / "receptive_field.json").write_text(json.dumps(
            {"tokens_holding_mass": {"50%": reach[0], "90%": reach[1], "99%": reach[2]}}))
    text = "\n".join(v4_sections(plan))
    # (a) rg_c16 vs ALiBi-4: +5% and +10% → mean +7.5%, within 10%; vs ALiBi-8: 105/90 − 1 = +16.7%, 110/88 − 1 = +25%
    assert "**rg_c16**: vs alibi yes: +7.5% (n=2, seeds +5.0 … +10.0%); vs alibi_l8 no: +20.8% (n=2, seeds +16.7 … " \
           "+25.0%)" in text
    # ALiBi-8 vs ALiBi-4: 90/100 − 1 = −10%, 88/100 − 1 = −12% → −11.0%
    assert "**alibi_l8 vs alibi** at 1×: -11.0% (n=2, seeds -12.0 … -10.0%)" in text
    # rg_c64: +30% and +26% → +28.0%
    assert "**rg_c64**: vs alibi no: +28.0% (n=2, seeds +26.0 … +30.0%)" in text
    # (b) adaptive: 104/105 = 0.990, 112.2/110 = 1.020 → mean 1.005, not flat; train: 0.990 and 0.990 → flat
    assert "**rg_c16** (adaptive): 1.005 (n=2, seeds 0.990 … 1.020: NOT flat)" in text
    assert "**rg_c16** (train): 0.990 (n=2, seeds 0.990 … 0.990: flat)" in text
    # (c) 90% within 12 ≤ C = 16: inside the first step's window; the window baseline's 90% within 30
    assert "**rg_c16** (train): 50% of the gradient within the last 3 tokens, 90% within 12 (inside its first " \
           "step's 16-token window), 99% within 200; the 64-key window's 90% lies within 30." in text
    # (d) C = 16: seed-0 gap +5.0%, mean +7.5%; C = 64: +30.0%, +28.0%; two depth steps each at T = 256
    assert "| 16 | 2 | rg_c16 | +5.0% | +7.5% (seeds +5.0 … +10.0) |" in text
    assert "| 64 | 2 | rg_c64 | +30.0% | +28.0% (seeds +26.0 … +30.0) |" in text
