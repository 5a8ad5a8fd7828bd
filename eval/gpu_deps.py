"""The packages the GPU machine's image lacks, as wheels in a git-ignored folder beside eval/gpu_campaign.sh.

The image has torch 2.11, Triton 3.6, transformers and sentencepiece, but no deepspeed (nor datasets or wandb, which
the trainer does not import: wandb is switched off, the check trains on random tokens) and no network. What
``import deepspeed`` and the trainer's DeepSpeed paths load at run time (checked with ``missing``: every
distribution they import, tests/test_gpu_campaign.py) that the image may lack:

    deepspeed, hjson, einops, py-cpuinfo, ninja, msgpack, psutil, pydantic, pydantic-core, annotated-types,
    typing-inspection, dill

    python eval/gpu_deps.py download --out eval/gpu_wheels      # here, with pip and PyPI (`make gpu-wheels`)
    python eval/gpu_deps.py install --wheels eval/gpu_wheels --target /tmp/regulargpt_deps   # there, offline
    python eval/gpu_deps.py missing        # the runtime imports neither in the list above nor in the image

``download`` pins the versions installed here (what the CPU tests ran), takes pure-Python wheels once and the
compiled ones (msgpack, psutil, pydantic-core) for CPython 3.10–3.13 on x86-64 Linux, and builds deepspeed's
wheel from its source distribution (PyPI has no deepspeed wheel; ``DS_BUILD_OPS=0``: its CUDA ops stay JIT, the
trainer uses none). ``install`` puts only the ones the running Python cannot import into `--target` with
``pip --no-index --no-deps`` (the image's own packages are left alone); add the target to PYTHONPATH.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

# distribution name → the module it is imported as
PURE = {"deepspeed": "deepspeed", "hjson": "hjson", "einops": "einops", "py-cpuinfo": "cpuinfo",
        "pydantic": "pydantic", "annotated-types": "annotated_types", "typing-inspection": "typing_inspection",
        "dill": "dill"}
COMPILED = {"msgpack": "msgpack", "psutil": "psutil", "pydantic-core": "pydantic_core", "ninja": "ninja"}
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
IMAGE = {"torch", "triton", "numpy", "packaging", "tqdm", "typing-extensions", "typing_extensions", "filelock",
         "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec", "setuptools", "nvidia-ml-py"}  # the image's
# imported by deepspeed only inside try/except (deepspeed/autotuning/autotuner.py), loaded here only because lm_eval
# (dev extra) installs it: absent on the image, deepspeed runs without it
OPTIONAL = {"tabulate"}


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download(out: Path) -> None:
    """Fill `out` (replaced as a whole, through a temporary folder) with the wheels listed in the module doc."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pins = {name: metadata.version(name) for name in [*PURE, *COMPILED]}
    _pip("download", "--quiet", "--no-deps", "--dest", str(tmp),
         *(f"{n}=={pins[n]}" for n in PURE if n != "deepspeed"))
    for python in PYTHONS:
        _pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
             "--platform", "manylinux_2_17_x86_64", "--python-version", python, "--dest", str(tmp),
             *(f"{n}=={pins[n]}" for n in COMPILED))
    _pip("download", "--quiet", "--no-deps", "--no-binary=:all:", "--dest", str(tmp), f"deepspeed=={pins['deepspeed']}")
    sdist = next(tmp.glob("deepspeed-*.tar.gz"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp), str(sdist)], check=True, env={**os.environ, "DS_BUILD_OPS": "0"})
    sdist.unlink()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"wrote {out}: {len(list(out.glob('*.whl')))} wheels, "
          f"{sum(p.stat().st_size for p in out.iterdir()) / 2**20:.1f} MiB")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def install(wheels: Path, target: Path) -> list[str]:
    """pip-install from `wheels` into `target` the listed distributions this Python cannot import → their names."""
    need = [name for name, module in {**PURE, **COMPILED}.items() if not _importable(module)]
    if need:
        if not wheels.is_dir():
            raise SystemExit(f"error: {wheels} does not exist; build it here with `make gpu-wheels` and carry it "
                             f"(missing: {', '.join(need)})")
        _pip("install", "--quiet", "--no-index", "--no-deps", "--find-links", str(wheels), "--target", str(target),
             *need)
    return need


def runtime_distributions() -> set[str]:
    """The distributions whose modules ``import deepspeed`` and the trainer's DeepSpeed paths load (this Python)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    before = set(sys.modules)
    import deepspeed  # noqa: F401
    import deepspeed.checkpoint  # noqa: F401
    import deepspeed.launcher.launch  # noqa: F401
    import deepspeed.launcher.runner  # noqa: F401
    import deepspeed.runtime.bf16_optimizer  # noqa: F401
    import deepspeed.runtime.zero.stage3  # noqa: F401
    import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
    import deepspeed.utils.zero_to_fp32  # noqa: F401

    owners = metadata.packages_distributions()
    loaded = {name.split(".")[0] for name in set(sys.modules) - before}
    return {dist.lower().replace("_", "-") for module in loaded for dist in owners.get(module, [])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("download", help="build the wheel folder here (pip, PyPI)")
    d.add_argument("--out", type=Path, default=Path("eval/gpu_wheels"))
    i = sub.add_parser("install", help="install what this Python lacks from the folder, offline")
    i.add_argument("--wheels", type=Path, default=Path("eval/gpu_wheels"))
    i.add_argument("--target", type=Path, required=True)
    sub.add_parser("missing", help="runtime distributions of deepspeed neither listed nor in the image")
    args = p.parse_args(argv)
    if args.command == "download":
        download(args.out)
    elif args.command == "install":
        need = install(args.wheels, args.target)
        print(f"installed into {args.target}: {', '.join(need)}" if need else "nothing to install")
    else:
        listed = {n.replace("_", "-") for n in [*PURE, *COMPILED, *IMAGE, *OPTIONAL]}
        extra = sorted(runtime_distributions() - listed)
        print("\n".join(extra) if extra else "none")
        return 1 if extra else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
