"""Operations (issue 14): the shared peak meter, extending a finished run, submitting sweeps, and stopping a run under
every launcher (plain python, torchrun, the deepspeed runner, Ctrl-C to the process group).

The bad inputs of the same issue are cases of tests/test_faults.py::test_bad_input_is_one_line_exit_2_and_changes_nothing;
the LR schedule's formula is tests/test_pretrain.py::test_lr_schedule_and_deepspeed_config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regulargpt import peak

# ------------------------------------------------------------------------------------------------ peak meter


def test_peak_is_measured_once_per_machine_then_cached_and_only_raised(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("REGULARGPT_PEAK_CACHE", str(cache))
    monkeypatch.delenv(peak.PEAK_ENV, raising=False)
    flops, how = peak.cached_peak("cpu", "fp32", threads=1, seconds=0.05)
    assert flops > 0 and how.startswith("measured over 0.05 s")
    key = peak.machine_key("cpu", "fp32", 1)
    assert "| cpu | fp32 | 1 threads" in key and json.loads(cache.read_text())[key]["flops"] == flops
    monkeypatch.setattr(peak, "measure_peak", lambda *a: pytest.fail("measured again instead of using the cache"))
    assert peak.cached_peak("cpu", "fp32", threads=1) == (flops, f"cached in {cache}")
    peak.raise_peak(key, flops / 2, "slower")  # never lowered
    peak.raise_peak(key, flops * 2, "faster")
    assert peak.cached_peak("cpu", "fp32", threads=1)[0] == flops * 2
    monkeypatch.setenv(peak.PEAK_ENV, "5e9")
    assert peak.cached_peak("cpu", "fp32", threads=1) == (5e9, peak.PEAK_ENV)
