"""Installable package `regulargpt` (RegularGPT + length-extrapolation baselines, pretraining and evaluation)."""
from setuptools import find_packages, setup

setup(
    name="regulargpt",
    version="0.1.0",
    description="RegularGPT and its length-extrapolation baselines: kernels, formal languages, DeepSpeed pretraining, evaluation",
    python_requires=">=3.10",
    packages=find_packages(include=["regulargpt", "regulargpt.*"]),
    package_data={"regulargpt.kernels": ["*.cpp", "*.h"]},  # the C++ kernel's source and headers, compiled on first use
    install_requires=[
        "torch>=2.4",
        "deepspeed",
        "datasets",
        "sentencepiece",
        "numpy",
        "wandb",
        "matplotlib",
        "tqdm",
        "psutil",  # training ranks watch their launcher (regulargpt/train/stopping.py)
        "ninja",  # builds the fused C++ CPU kernel on first use (regulargpt/kernels/)
        "safetensors",  # weights files of the Hugging Face and safetensors exports
    ],
    # pytest-xdist: `make test` runs the suite on 2 workers; triton: the Triton kernel's tests run on CPU under
    # TRITON_INTERPRET=1; transformers + protobuf: the HF export tests (protobuf reads the sentencepiece model when
    # converting it to tokenizer.json); lm_eval[hf] (0.4.13 tested; the hf extra brings accelerate): the real
    # lm-evaluation-harness client on an export (tests/test_lm_eval.py, docs/EVALUATION.md)
    extras_require={"dev": ["pytest", "pytest-xdist", "triton", "transformers", "protobuf", "lm_eval[hf]>=0.4.13"]},
    # The main commands; launch/*.py and eval/*.py are thin wrappers of the same `main` functions, so that
    # `deepspeed launch/pretrain.py --config …` and every documented `python …` command work from a checkout.
    entry_points={
        "console_scripts": [
            "regulargpt-pretrain = regulargpt.commands.pretrain:console",
            "regulargpt-train-formal = regulargpt.commands.train_formal:console",
            "regulargpt-extrapolate = regulargpt.commands.extrapolate:console",
            "regulargpt-generate = regulargpt.commands.generate:console",
            "regulargpt-formal = regulargpt.commands.formal_suite:console",
            "regulargpt-export = regulargpt.commands.export:console",
            "regulargpt-submit = regulargpt.commands.submit:console",
            "regulargpt-lm-comparison = regulargpt.commands.lm_comparison:console",
        ],
    },
)
