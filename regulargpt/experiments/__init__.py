"""Experiments that train and then evaluate: the layer above :mod:`regulargpt.train` and
:mod:`regulargpt.evaluation` (neither of which imports it; ``tests/test_imports.py`` checks). Import the submodule
you need:

    from regulargpt.experiments.formal_sweep import load_profile, plan_runs, run_sweep   # train + range-evaluate
    from regulargpt.experiments.formal_tables import write_tables                        # Tables 1 and 2 of a sweep
"""
