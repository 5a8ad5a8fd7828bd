"""The C++ operator's source builds wherever a compiler is: on this machine (the other kernel tests skip when the
build fails, so a build error must fail here), and, on x86, for both instruction sets it has code paths for:
x86-64-v3 (AVX2: the head sweep on two 256-bit registers per 16 lanes) and x86-64-v4 (AVX-512: one register). A
name used outside its `#ifdef SD_SWEEP` compiles on one machine and breaks the build on the other."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from regulargpt.kernels import sliding_dilated_cpp

COMPILER = shutil.which("c++")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler on this machine")


def test_the_operator_builds_on_this_machine() -> None:
    assert sliding_dilated_cpp.build_error() is None, sliding_dilated_cpp.build_error()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists() or platform.machine() != "x86_64", reason="x86 Linux flags")
def test_the_sweep_reports_the_instruction_set_this_cpu_has() -> None:
    """-march=native: AVX-512 F/BW/DQ/VL give the 512-bit sweep, else AVX2 + FMA + F16C the 256-bit one, else none."""
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    expected = ("AVX-512" if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(flags)
                else "AVX2" if {"avx2", "fma", "f16c"} <= set(flags) else "none")
    assert sliding_dilated_cpp.head_sweep_isa() == expected
    assert sliding_dilated_cpp.head_sweep_available() == (expected != "none")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction-set levels")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
def test_the_source_compiles_for_each_instruction_set(march: str) -> None:
    includes = [flag for path in [*include_paths(), sysconfig.get_paths()["include"]] for flag in ("-isystem", path)]
    command = [COMPILER, "-fsyntax-only", "-std=c++20", "-O3", f"-march={march}", "-fopenmp",
               "-DTORCH_EXTENSION_NAME=syntax_check", "-DTORCH_API_INCLUDE_EXTENSION_H", *includes,
               str(sliding_dilated_cpp._SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{march}: {done.stderr[-3000:]}"
    if march == "x86-64-v4":  # the sweep's code is in this compile: a syntax error there must fail it
        probe = subprocess.run([COMPILER, f"-march={march}", "-dM", "-E", "-x", "c++", "/dev/null"],
                               capture_output=True, text=True, check=True)
        assert all(f"__{isa}__" in probe.stdout for isa in ("AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL"))
