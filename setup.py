"""Install rlflow.  ``pip install -e .[test] -c constraints.txt`` on CPU machines."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent

# transformers: a range that vLLM 0.33 also accepts keeps ``rlflow[vllm]`` resolvable.
INSTALL_REQUIRES = [
    "torch>=2.6",
    "transformers>=5.0,<5.21",
    "tokenizers>=0.21",
    "accelerate>=1.0",
    "ray>=2.45",
    "hydra-core>=1.3.2,<1.4",
    "omegaconf>=2.3",
    "tensordict>=0.8,<0.16",
    "numpy>=1.26",
    "pyarrow>=15",
    "pandas>=2.0",
    "datasets>=3.0",
    "tqdm>=4.60",
    "matplotlib>=3.7",
]

EXTRAS = {
    "test": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "ruff>=0.6",
        "tensorboard>=2.14",
        "mlflow-skinny>=2.10",
        "peft>=0.13",
    ],
    "vllm": ["vllm>=0.33.0"],
    "gpu": ["flash-attn>=2.6"],
    "logging": ["tensorboard>=2.14", "wandb>=0.17", "mlflow>=2.10"],
}

setup(
    name="rlflow",
    version="0.1.0",
    description="Reinforcement learning for language models: PPO with a critic, GRPO and friends, "
    "on a Ray single controller with FSDP workers.",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8")
    if (ROOT / "README.md").exists()
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[*find_packages(include=["rlflow", "rlflow.*"]), "rlflow.config.files"],
    # The Hydra configs live at the repository root and ship inside the wheel as ``rlflow.config.files``.
    package_dir={"rlflow.config.files": "config"},
    package_data={"rlflow.config.files": ["*.yaml", "*/*.yaml", "*/*/*.yaml"]},
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
