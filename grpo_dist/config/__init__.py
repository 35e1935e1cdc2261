"""One typed config tree: YAML file + dotted command-line overrides, validated before anything starts.

Only pydantic and yaml are imported here, so a bad config fails in well under a second, before
torch, Ray or vLLM are touched. ``load_config`` raises ``ConfigError`` whose message is one line
naming the key and the problem; the CLI prints it and exits with code 2.

``sections`` holds one model per top-level key, ``root`` the ``Config`` with the checks across
sections, ``load`` the YAML + overrides loading.
"""

from grpo_dist.config.sections import (AGG_MODES, GPU_MEM_COLOCATED, GPU_MEM_DISAGGREGATED, KL_KINDS, STRATEGIES,
                                       AlgoConfig, CheckpointConfig, ClusterConfig, ConfigError, DataConfig,
                                       EvalConfig, LearnerConfig, LoggingConfig, LoraConfig, ModelConfig,
                                       RewardConfig, RewardFnConfig, RolloutConfig, Section, SyncConfig,
                                       TinyModelSpec, TrainerConfig)
from grpo_dist.config.root import Config, auto_staleness
from grpo_dist.config.load import adapter_configs, config_from_dict, dump_config, load_config, parse_overrides

__all__ = ["AGG_MODES", "GPU_MEM_COLOCATED", "GPU_MEM_DISAGGREGATED", "KL_KINDS", "STRATEGIES", "AlgoConfig",
           "CheckpointConfig", "ClusterConfig", "Config", "ConfigError", "DataConfig", "EvalConfig",
           "LearnerConfig", "LoggingConfig", "LoraConfig", "ModelConfig", "RewardConfig", "RewardFnConfig",
           "RolloutConfig", "Section", "SyncConfig", "TinyModelSpec", "TrainerConfig", "adapter_configs", "auto_staleness",
           "config_from_dict", "dump_config", "load_config", "parse_overrides"]
