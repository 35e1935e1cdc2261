"""grpo_dist: distributed GRPO fine-tuning of LLMs on Ray (vLLM rollouts, DeepSpeed + LoRA learner)."""

__version__ = "0.1.0"
