"""The Triton kernel's CPU-side proxies: registers/spills per kernel (AOT compile, sm_90), bytes moved (interpreter).

No GPU is needed. Two measurements, docs/KERNELS.md explains what they bound:

* ``registers``: every launch of one forward + backward call at the given shape is captured (the op's own argument
  building, with CUDA block sizes; nothing runs), compiled ahead of time with ``triton.compile`` for
  ``GPUTarget("cuda", 90, 32)`` with the JIT's specialisations (pointers and 16-divisible ints get
  ``tt.divisibility`` 16, ints equal to 1 become constexprs), and ``ptxas -v -arch=sm_90a`` reports registers, spill
  bytes and shared memory; the PTX is searched for vectorised global loads (``ld.global.v4`` / ``.v2``).
* ``bytes``: one forward + backward under ``TRITON_INTERPRET=1`` (a child process sets it before triton's import),
  with the interpreter's load/store builders wrapped: requested bytes (masked-in elements × itemsize) and unique
  bytes per kernel, in units of one (B, T, H, Dh) tensor.

    python eval/kernel_resources.py --out results/triton_resources.md
    python eval/kernel_resources.py --mode registers --length 16384 --chunks 8,16 --dilations 1,8,64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from regulargpt.files import atomic_write_text  # noqa: E402

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
_POINTER = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.float16: "*fp16"}


def capture_launches(length: int, heads: int, head_dim: int, chunk: int, dilation: int, dtype: torch.dtype,
                     pad: bool, on_launch=None) -> list[tuple[str, tuple, dict]]:
    """(kernel name, positional args, constexprs) of every launch in one forward + backward call, with the block
    sizes CUDA would use. With on_launch(name) given, each is also launched after it (interpreter); else none runs."""
    from regulargpt.kernels import sliding_dilated_triton as kernels

    launches: list[tuple[str, tuple, dict]] = []
    original_launch, original_block = kernels._launch, kernels._block

    def launch(kernel, q, grid, *args, **meta):
        launches.append((_name(kernel), args, meta))
        if on_launch is not None:
            on_launch(launches[-1][0])
            kernel[grid](*args, **meta)

    kernels._launch = launch
    kernels._block = lambda device, head_block, register_tiles: original_block(torch.device("cuda"), head_block,
                                                                               register_tiles)
    try:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, length, heads, head_dim, generator=gen).to(dtype) for _ in range(3))
        r = torch.randn(heads, chunk, generator=gen) * 0.02
        pk, pv = (torch.randn(1, heads, head_dim, generator=gen).to(dtype) for _ in range(2)) if pad else (None, None)
        out, lse = kernels._sliding_dilated_op(q, k, v, r, dilation, pk, pv, 0, 1)
        kernels._sliding_dilated_backward_op(torch.randn_like(out), q, k, v, r, dilation, pk, pv, lse, 0, 1)
    finally:
        kernels._launch, kernels._block = original_launch, original_block
    return launches


def _name(kernel: object) -> str:
    """The @triton.jit function's name through any Autotuner / Heuristics wrapping."""
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel.__name__


def _ptxas() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"


def compile_resources(name: str, args: tuple, meta: dict, num_warps: int = 4, num_stages: int = 3) -> dict:
    """{registers, spill_stores, spill_loads, shared, vector_loads} of one launch compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from regulargpt.kernels import sliding_dilated_triton as kernels

    fn = getattr(kernels, name)
    while not isinstance(fn, triton.JITFunction):  # an Autotuner / Heuristics wraps it
        fn = fn.fn
    runtime = [p for p in fn.arg_names if p not in meta]
    signature, constexprs, attrs = {}, dict(meta), {}
    for index, (arg_name, value) in enumerate(zip(runtime, args, strict=True)):
        position = fn.arg_names.index(arg_name)
        if isinstance(value, torch.Tensor):
            signature[arg_name] = _POINTER[value.dtype]
            attrs[(position,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool) or (isinstance(value, int) and value == 1):
            signature[arg_name] = "constexpr"
            constexprs[arg_name] = value
        elif isinstance(value, int):
            signature[arg_name] = "i64" if abs(value) >= 2**31 else "i32"
            if value % 16 == 0:
                attrs[(position,)] = [["tt.divisibility", 16]]
        else:
            signature[arg_name] = "fp32"
    for arg_name in meta:
        signature[arg_name] = "constexpr"
    signature = {p: signature[p] for p in fn.arg_names}
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        report = subprocess.run([str(_ptxas()), "-v", "-arch=sm_90a", str(path), "-o", str(Path(tmp) / "k.cubin")],
                                capture_output=True, text=True, check=True).stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, report)) else 0  # noqa: E731
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "shared": number(r"(\d+) bytes smem"),
            "loads_v4": len(re.findall(r"ld\.global[.\w]*\.v4", ptx)),
            "loads_v2": len(re.findall(r"ld\.global[.\w]*\.v2", ptx)),
            "loads_scalar": len(re.findall(r"ld\.global(?:\.[a-z]+)*\.(?:b16|b32|u16|f32)\b", ptx))}


def registers(args: argparse.Namespace) -> list[dict]:
    rows = []
    for chunk in args.chunks:
        for dilation in args.dilations:
            for name, launch_args, meta in capture_launches(args.length, args.heads, args.head_dim, chunk, dilation,
                                                            _DTYPES[args.dtype], pad=True):
                block = {k: v for k, v in meta.items() if k.startswith("BLOCK")}
                rows.append({"kernel": name, "C": chunk, "D": dilation, **block,
                             **compile_resources(name, launch_args, meta)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def count_bytes(length: int, heads: int, head_dim: int, chunk: int, dilation: int) -> list[dict]:
    """Per kernel of one fp32 forward + backward with pads: requested and unique bytes in tensor-equivalents.
    Needs TRITON_INTERPRET=1 set before triton's import."""
    import numpy as np
    from triton.runtime import interpreter

    counts: dict[str, list] = {}
    current = ["?"]
    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def record(ptrs, mask):
        chosen = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)]
        entry = counts.setdefault(current[0], [0, []])
        entry[0] += chosen.size * (ptrs.get_element_ty().primitive_bitwidth // 8)
        entry[1].append(chosen.reshape(-1).astype(np.uint64))

    def masked_load(self, ptrs, mask, *rest):  # rest: other, cache policy, … (Triton 3.6 added an argument)
        record(ptrs, mask)
        return load(self, ptrs, mask, *rest)

    def masked_store(self, ptrs, value, mask, *rest):
        record(ptrs, mask)
        return store(self, ptrs, value, mask, *rest)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    try:
        launches = capture_launches(length, heads, head_dim, chunk, dilation, torch.float32, pad=True,
                                    on_launch=lambda name: current.__setitem__(0, name))
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store
    tensor = length * heads * head_dim  # elements of one (B = 1, T, H, Dh) tensor; every buffer here is 4 bytes
    rows = []
    for name in dict.fromkeys(launch[0] for launch in launches):
        requested, parts = counts.get(name, [0, []])
        unique = np.unique(np.concatenate(parts)).size if parts else 0
        rows.append({"kernel": name, "C": chunk, "D": dilation, "requested": requested / 4 / tensor,
                     "unique": unique / tensor})
    return rows


def _bytes_in_child(args: argparse.Namespace) -> list[dict]:
    """count_bytes in a child process with TRITON_INTERPRET=1 (it must be set before triton's import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'eval')!r}); from kernel_resources import count_bytes; "
            f"print(json.dumps([row for c in {args.chunks!r} for d in {args.dilations!r} "
            f"for row in count_bytes({args.bytes_length}, {args.bytes_heads}, {args.head_dim}, c, d)]))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the interpreter child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _markdown(args: argparse.Namespace, reg_rows: list[dict], byte_rows: list[dict]) -> str:
    import platform
    import triton

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = ["# Triton kernel: CPU-side proxies (registers/spills for sm_90, bytes under the interpreter)", "",
             f"Command: `python eval/kernel_resources.py {' '.join(sys.argv[1:])}`  ",
             f"Commit {commit.strip()}, triton {triton.__version__}, torch {torch.__version__}, "
             f"{platform.node()}, num_warps 4, num_stages 3. docs/KERNELS.md says what the figures bound.", ""]
    if reg_rows:
        lines += [f"## Registers (T = {args.length}, H {args.heads}, Dh {args.head_dim}, {args.dtype}, pads)", "",
                  "| kernel | C | D | block | registers | spill stores B | spill loads B | shared B | ld.v4 | ld.v2 "
                  "| ld scalar |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in reg_rows:
            block = " ".join(f"{k}={v}" for k, v in r.items() if k.startswith("BLOCK"))
            lines.append(f"| {r['kernel']} | {r['C']} | {r['D']} | {block} | {r['registers']} | {r['spill_stores']} "
                         f"| {r['spill_loads']} | {r['shared']} | {r['loads_v4']} | {r['loads_v2']} "
                         f"| {r['loads_scalar']} |")
        lines.append("")
    if byte_rows:
        lines += [f"## Bytes, fp32 with pads, B 1 H {args.bytes_heads} T {args.bytes_length} Dh {args.head_dim}, "
                  "CUDA block sizes (tensor-equivalents: units of one (B, T, H, Dh) tensor)", "",
                  "| C | D | kernel | requested | unique | requested ÷ unique |", "|---:|---:|---|---:|---:|---:|"]
        for r in byte_rows:
            ratio = r["requested"] / r["unique"] if r["unique"] else float("nan")
            lines.append(f"| {r['C']} | {r['D']} | {r['kernel']} | {r['requested']:.2f} | {r['unique']:.2f} "
                         f"| {ratio:.2f} |")
        lines += ["", "| C | D | launches | requested fwd+bwd | unique fwd+bwd | requested ÷ unique |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for c in args.chunks:
            for d in args.dilations:
                sel = [r for r in byte_rows if r["C"] == c and r["D"] == d]
                req, uni = sum(r["requested"] for r in sel), sum(r["unique"] for r in sel)
                lines.append(f"| {c} | {d} | {len(sel)} | {req:.2f} | {uni:.2f} | {req / uni:.2f} |")
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["all", "registers", "bytes"], default="all")
    parser.add_argument("--length", type=int, default=16384, help="T for the register compile (default 16384)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--chunks", type=_ints, default=[8, 16], help="C values, e.g. 8,16")
    parser.add_argument("--dilations", type=_ints, default=[1, 8, 64], help="e.g. 1,8,64")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16", help="register compile dtype")
    parser.add_argument("--bytes-length", type=int, default=1024, help="T for the interpreter byte count")
    parser.add_argument("--bytes-heads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="markdown report, e.g. results/triton_resources.md")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("run without TRITON_INTERPRET=1: the byte count sets it in its own child process")
    reg_rows = registers(args) if args.mode in ("all", "registers") else []
    byte_rows = _bytes_in_child(args) if args.mode in ("all", "bytes") else []
    text = _markdown(args, reg_rows, byte_rows)
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
