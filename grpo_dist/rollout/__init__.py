"""Generator backends (vLLM CPU/GPU, transformers) and the RolloutWorker."""
