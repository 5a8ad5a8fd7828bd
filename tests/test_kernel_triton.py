"""The Triton sliding-dilated kernel, tested on every machine under Triton's interpreter on CPU tensors.

TRITON_INTERPRET=1 has to be set before triton is first imported (it also makes triton's own @jit library functions,
tl.sum among them, interpreted), and set in this process it would change every later triton user of the session. So
the cases (tests/triton_kernel_cases.py) run in one child process that has it; this process keeps its environment.
"""

import importlib.util
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, run_env

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install -e '.[dev]' brings it)")


def test_the_kernel_cases_pass_under_the_interpreter() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           "tests/triton_kernel_cases.py"], cwd=ROOT, env=run_env(TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]  # not skipped whole: the child saw TRITON_INTERPRET


def test_cpu_tensors_without_the_interpreter_get_a_clear_error() -> None:
    from regulargpt.kernels.sliding_dilated_triton import triton_sliding_dilated_attention

    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        triton_sliding_dilated_attention(q, q, q, torch.zeros(2, 2), 2)
