"""grpo_dist: distributed GRPO fine-tuning of LLMs on Ray (vLLM rollouts, DeepSpeed + LoRA learner).

``from grpo_dist import GRPOTrainer, GRPOConfig``: the Python API, as TRL's (``api.py``,
docs/python-api.md); imported when first named, so ``import grpo_dist`` stays light."""

__version__ = "0.1.0"

__all__ = ["GRPOConfig", "GRPOTrainer", "__version__"]


def __getattr__(name: str):
    if name in ("GRPOConfig", "GRPOTrainer"):  # (by name: the package's modules read __version__ from here,
        import importlib  # and grpo_dist.api sits above them all in the layers)

        return getattr(importlib.import_module("grpo_dist.api"), name)
    raise AttributeError(f"module 'grpo_dist' has no attribute {name!r}")
