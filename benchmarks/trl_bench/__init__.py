"""The modules of benchmarks/trl_compare.py (TRL's GRPOTrainer vs grpo_dist): machine (the CPU, the load,
who used the cores), workloads (models, settings, both systems' arguments), runners (a TRL run in a
subprocess, a grpo_dist run in this process), report (medians, the tables, the ratios)."""
