"""The LM studies' plans (regulargpt.experiments.lm_comparison, run by eval/lm_comparison.py): which (dataset,
variant, seed) trainings a plan runs, and how it says so."""

from __future__ import annotations

from pathlib import Path

from regulargpt.experiments import lm_comparison as cli


def _plan(*models: object) -> object:
    return cli.Plan(out=Path("unused"), datasets=("a", "b"), models=models, seeds={"a": (0, 1, 2), "b": (0,)},
                    steps=1, batch_size=1, multiples=1, eval_tokens=1)


def test_variant_seeds_and_datasets_restrict_the_trainings() -> None:
    plan = _plan(cli.Variant("rg", "regular_gpt"), cli.Variant("abl", "regular_gpt", datasets=("a",), seeds=(0,)),
                 cli.Variant("c8", "regular_gpt", seeds=(0, 2)))
    got = [(d, m.name, s) for d, m, s in plan.trainings()]
    # dataset-major, then seed-major, so every row gets its first seed before any row gets a second
    assert got == [("a", "rg", 0), ("a", "abl", 0), ("a", "c8", 0), ("a", "rg", 1), ("a", "rg", 2), ("a", "c8", 2),
                   ("b", "rg", 0), ("b", "c8", 0)]
    assert plan.seed_summary() == "a: rg 3 seeds; c8 2 seeds; abl 1 seed · b: rg, c8 1 seed"


def test_the_v2_study_trains_its_headline_rows_with_every_seed() -> None:
    counts: dict[tuple[str, str], int] = {}
    for d, m, _ in cli.V2.trainings():
        counts[d, m.name] = counts.get((d, m.name), 0) + 1
    for name in ("regular_gpt", "alibi", "rg_c8"):
        assert counts["python-stdlib", name] == 3 and counts["debian-prose", name] == 1
    assert all(n == 1 for (d, name), n in counts.items() if name not in ("regular_gpt", "alibi", "rg_c8"))


def test_a_plan_trains_and_evaluates_at_its_own_training_length() -> None:
    plan = cli.V2_T256
    assert plan.lengths == [256, 512, 1024, 2048, 4096, 8192] and plan.train_tokens == 300 * 16 * 256
    assert plan.train_tokens == cli.V2.train_tokens  # the same tokens as the T = 64 study
    sets = cli.train_overrides(plan, "python-stdlib", 0, plan.models[0])
    assert "data.seq_len=256" in sets and "model.chunk_size=8" in sets
