"""Small process-level helpers every layer may use: free ports, file trees, process environment defaults.

Imports nothing else of grpo_dist."""
