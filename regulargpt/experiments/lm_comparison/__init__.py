"""The CPU-scale length-extrapolation comparison of language models: RegularGPT against ALiBi, T5, KERPLE-log/power,
RoPE and NoPE. :mod:`.plans` (what a study trains and scores), :mod:`.stages` (data, parameter budget, training,
evaluation), :mod:`.estimate` (a study's CPU time from recorded timings), :mod:`.report` (the study's README). The command is :mod:`regulargpt.commands.lm_comparison`
(`python eval/lm_comparison.py`)."""

from regulargpt.experiments.lm_comparison.plans import (
    DATASETS,
    DEMO,
    FULL,
    MODELS,
    ROOT,
    STUDIES,
    V2,
    V2_T256,
    V3,
    V3_BUDGET_MODELS,
    V3_BUDGETS,
    VOCAB,
    Plan,
    RopeScaling,
    Stage,
    Variant,
    rel_path,
    train_overrides,
)
from regulargpt.experiments.lm_comparison.estimate import estimate_table, stage_costs
from regulargpt.experiments.lm_comparison.report import discussion, write_readme
from regulargpt.experiments.lm_comparison.stages import (
    Need,
    children_cpu,
    done,
    evaluate_all,
    missing_rows,
    parameter_counts,
    prepare_data,
    train_all,
    training_records,
)

__all__ = ["DATASETS", "DEMO", "FULL", "MODELS", "ROOT", "STUDIES", "V2", "V2_T256", "V3", "V3_BUDGETS",
           "V3_BUDGET_MODELS", "VOCAB", "Need", "Plan", "RopeScaling", "Stage", "Variant", "children_cpu", "discussion",
           "estimate_table", "done", "evaluate_all", "missing_rows", "parameter_counts", "prepare_data", "rel_path", "stage_costs",
           "train_all", "train_overrides", "training_records", "write_readme"]
