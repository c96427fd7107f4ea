"""megatron-adaptor: megatron-core 0.19.2 on Ascend NPU, NVIDIA GPU and CPU."""
from setuptools import find_packages, setup

setup(
    name="megatron-adaptor",
    version="0.1.0",
    description="A MindSpeed-style patch layer that runs megatron-core's own training loop on NPU, GPU and CPU",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.12",
    packages=find_packages(include=["adaptor", "adaptor.*", "patches", "patches.*"]),
    py_modules=["pretrain_gpt", "pretrain_mm"],
    # the snapshot of Megatron's parser the command line is checked against before torch is imported
    package_data={"adaptor.command_line": ["megatron_parser.json"]},
    install_requires=[
        # The patches target exactly this release; adaptor checks it at import.
        "megatron-core==0.19.2",
        "torch>=2.6",
        "safetensors",
        "numpy",
        "tokenizers",
        # tools/preprocess_data.py renders chat templates (instruction datasets) in a sandboxed Jinja2.
        "jinja2>=3.1.6",
        "wrapt",
        "psutil",
        "pyyaml",
        # megatron-core builds hierarchical context-parallel groups (--cp-comm-type a2a+p2p) with it.
        "einops",
    ],
    extras_require={
        "npu": ["torch_npu"],
        # tools/preprocess_data.py reads parquet through pyarrow.
        "parquet": ["pyarrow"],
        # pretrain_mm.py decodes images with Pillow.
        "mm": ["Pillow"],
        # --tensorboard-dir and --wandb-project write through these.
        "tensorboard": ["tensorboard"],
        "wandb": ["wandb"],
        # evaluation.py runs benchmarks through lm-eval; nothing else imports it.
        "eval": ["lm-eval>=0.4.9"],
        # transformers (and peft, for LoRA adapters) are the references the tokenizer and model parity
        # tests compare against; training itself never imports them. tensorboard and wandb (offline) for
        # the visibility tests; lm-eval (its hf backend is evaluation.py's reference).
        "test": ["pytest", "transformers", "peft", "Pillow", "tensorboard", "wandb", "lm-eval>=0.4.9"],
    },
)
