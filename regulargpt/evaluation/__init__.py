"""Evaluation: perplexity sweeps over evaluation lengths with their tables and plots, formal-language range
evaluation, and the analyses. Import the submodule you need (nothing is imported here, so importing the package
is cheap):

    from regulargpt.evaluation.length_sweep import sweep
    from regulargpt.evaluation.perplexity import plan_tokens, plan_windows
    from regulargpt.evaluation.lm_report import write_report
"""
