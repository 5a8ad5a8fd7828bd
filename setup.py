"""Installable package `regulargpt` (RegularGPT + length-extrapolation baselines, pretraining and evaluation)."""
from setuptools import find_packages, setup

setup(
    name="regulargpt",
    version="0.1.0",
    description="RegularGPT and its length-extrapolation baselines: kernels, formal languages, DeepSpeed pretraining, evaluation",
    python_requires=">=3.10",
    packages=find_packages(include=["regulargpt", "regulargpt.*"]),
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
    ],
    extras_require={"dev": ["pytest"]},
)
