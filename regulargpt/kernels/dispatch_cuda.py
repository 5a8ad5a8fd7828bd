"""`auto`'s rule on CUDA: the fastest correct algorithm per call, read from a measured table (dispatch_cuda.json).

The table holds cells measured on a GPU (forward + backward, CUDA events, by `eval/bench_kernel_gpu.py
--dispatch-table`): each names a length T, chunk size C, dilation D, a dtype width (2 or 4 bytes) and the fastest
algorithm whose output and gradients matched (``"triton"``, ``"shift"`` or ``"blocked"``). A call takes the cell of
its dtype width nearest in

    distance = |log2(C / C_cell)| + |log2(T / T_cell)| + |log2(D / D_cell)|

if that distance is at most the table's ``reach_log2``; otherwise (or with no cell of that width) the table says
nothing and the caller falls back to the measured CPU-independent band rule (`choose_band`). Worked example with
the single cell (T 16384, C 8, D 8, 2 bytes → triton) and reach 3: a bf16 call at T 16384, C 16, D 16 is at
distance 0 + 1 + 1 = 2 → triton; at T 512, C 8, D 8 it is 5 away → no answer; any fp32 call → no answer.

    {"reach_log2": 3, "source": "...", "cells": [{"length": 16384, "chunk": 8, "dilation": 8, "dtype_bytes": 2,
     "fastest": "triton", "ms": {"triton": 2.29, "blocked": 2.66, "shift": 4.13}}]}
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

__all__ = ["TABLE", "load_table", "table_choice", "triton_build_error"]

TABLE = Path(__file__).with_name("dispatch_cuda.json")
_ALGORITHMS = ("triton", "shift", "blocked")


def load_table(path: str | Path = TABLE) -> dict:
    """The table at `path`, validated: a clear error naming the file and the bad key."""
    table = json.loads(Path(path).read_text())
    if not isinstance(table.get("reach_log2"), (int, float)) or not isinstance(table.get("cells"), list):
        raise ValueError(f"{path}: needs a number 'reach_log2' and a list 'cells'")
    for i, cell in enumerate(table["cells"]):
        for key in ("length", "chunk", "dilation", "dtype_bytes"):
            if not isinstance(cell.get(key), int) or cell[key] < 1:
                raise ValueError(f"{path}: cells[{i}].{key} must be a positive int; got {cell.get(key)!r}")
        if cell.get("fastest") not in _ALGORITHMS:
            raise ValueError(f"{path}: cells[{i}].fastest must be one of {_ALGORITHMS}; got {cell.get('fastest')!r}")
    return table


_DEFAULT_TABLE = load_table(TABLE)  # read at import, so torch.compile traces only the arithmetic of table_choice


def _default_table() -> dict:
    return _DEFAULT_TABLE


def table_choice(chunk_size: int, dilation: int, length: int, dtype: torch.dtype, table: dict | None = None
                 ) -> str | None:
    """The nearest measured cell's fastest algorithm (module docstring), or None where the table says nothing."""
    table = _default_table() if table is None else table
    width = dtype.itemsize
    best: tuple[float, str] | None = None
    for cell in table["cells"]:
        if cell["dtype_bytes"] != width:
            continue
        distance = (abs(math.log2(chunk_size / cell["chunk"])) + abs(math.log2(length / cell["length"]))
                    + abs(math.log2(dilation / cell["dilation"])))
        if best is None or distance < best[0]:
            best = (distance, cell["fastest"])
    if best is None or best[0] > table["reach_log2"]:
        return None
    return best[1]


@torch.compiler.assume_constant_result  # torch.compile runs it eagerly when tracing, and keeps the answer
def triton_build_error() -> str | None:
    """None when the Triton kernel imports, and on a CUDA machine also compiles and runs a tiny forward + backward;
    else why not (tried once per process)."""
    return _triton_build_error()


@functools.cache
def _triton_build_error() -> str | None:
    try:
        from regulargpt.kernels.sliding_dilated_triton import triton_sliding_dilated_attention
    except Exception as exc:  # noqa: BLE001 (ImportError, or triton failing on import: the reason is reported)
        return f"triton does not import: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        q, k, v = (torch.randn(1, 8, 1, 16, device="cuda", requires_grad=True) for _ in range(3))
        r = torch.zeros(1, 2, device="cuda", requires_grad=True)
        triton_sliding_dilated_attention(q, k, v, r, 2).sum().backward()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 (a compile or launch failure: reported, auto falls back)
        return f"the Triton kernel failed to build or run: {type(exc).__name__}: {str(exc)[:300]}"
    return None
