"""The functions the task YAML names (lm-eval loads this file by its path): both live in
:mod:`regulargpt.evaluation.lm_eval_documents`."""

from regulargpt.evaluation.lm_eval_documents import load_split, process_results

__all__ = ["load_split", "process_results"]
