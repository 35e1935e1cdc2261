"""The ``rollout`` section: engines, sampling, multi-turn environments and their limits."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from grpo_dist.config.base import Section

GPU_MEM_DISAGGREGATED = 0.9
GPU_MEM_COLOCATED = 0.5


class RolloutConfig(Section):
    backend: Literal["vllm", "hf"] = Field("vllm", description="Generation engine: vLLM (CPU or GPU build) or transformers.")
    num_workers: int = Field(2, gt=0, description="Number of rollout actors (each owns one engine).")
    group_size: int = Field(8, description="G: completions sampled per prompt (>= 2).")
    prompts_per_step: int = Field(8, gt=0, description="Prompts per training step (batch = prompts_per_step * G).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling.")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling (-1 = off).")
    generate_timeout_s: float = Field(3600.0, gt=0, description="A rollout worker silent this long on one "
                                      "generate call is treated as hung: killed and replaced (cluster.max_restarts).")
    max_tokens: int = Field(8, gt=0, description="Max completion tokens.")
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="Engine weights dtype (null = model.dtype, except float32 where the engines merge a LoRA "
        "adapter into bfloat16/float16 weights: such a merge adds rounding noise about as large as the adapter's "
        "change). bfloat16 on a CPU with AVX512-BF16 generates "
        "faster than float32 (benchmarks/NOTES.md); the learner keeps model.dtype, so the samples come from a rounded "
        "copy of the policy: watch train/logprob_diff_behaviour_mean and set algo.rollout_is: truncate to correct it.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    seed: Optional[int] = Field(None, description="Engine seed (None = derived from trainer.seed and worker rank).")
    gpu_memory_utilization: Optional[float] = Field(
        None, gt=0, le=1.0, description="vLLM memory fraction (GPU build). null = by layout: disaggregated "
        f"{GPU_MEM_DISAGGREGATED} x min(1, cluster.rollout_gpus), colocated {GPU_MEM_COLOCATED} (the learner shares "
        "the GPU); 0.3 on CPU, where it is unused.")
    cpu_kvcache_gb: Optional[float] = Field(None, gt=0, description="vLLM CPU build KV-cache size in GiB (fractions "
                                            "allowed: 0.5). Set: wins over an exported VLLM_CPU_KVCACHE_SPACE (a "
                                            "warning names both); null = VLLM_CPU_KVCACHE_SPACE if exported, else 1.")
    enforce_eager: Optional[bool] = Field(None, description="Disable CUDA graphs / compilation in vLLM (null = "
                                          "false when cluster.rollout_gpus > 0, i.e. CUDA graphs on; true on CPU). "
                                          "false on CPU: vLLM compiles the model (inductor's C++ backend): engines start "
                                          "later, then generate faster than eager (benchmarks/NOTES.md); "
                                          "for long runs.")
    engine_in_process: Optional[bool] = Field(
        None, description="Run vLLM's engine core inside the rollout actor's process (null = true on CPU, false when "
        "cluster.rollout_gpus > 0). In the actor: no engine-core and worker processes to start (the engine starts "
        "sooner and holds less memory), and a dead engine is a dead actor, which recovery replaces. In its own "
        "process (vLLM's default): the scheduler overlaps the model's steps, what GPUs want. The streaming "
        "pipeline's async engine always has a process of its own (true is refused with rollout.streaming).")
    max_loras: int = Field(1, gt=0, description="Adapters vLLM keeps resident (old versions are evicted).")
    hf_max_batch_size: int = Field(128, gt=0, description="rollout.backend hf: rows (prompts x samples) decoded "
                                   "together; a call is cut into chunks of at most this many (lower it if the "
                                   "KV cache does not fit). Seeded samples do not depend on it.")
    adapter_mode: Literal["auto", "lora", "merged"] = Field(
        "auto", description="How engines serve a LoRA version: lora = as an adapter (vLLM LoRA kernels); merged = "
        "the worker merges it into the base weights and reloads them in place (on CPU faster than vLLM's CPU LoRA kernels); auto = "
        "merged on CPU engines (cluster.rollout_gpus 0), lora on GPUs. The choice is logged at start.")
    streaming: bool = Field(False, description="Streaming pipeline (vLLM only): each rollout actor runs vLLM's async "
                            "engine and takes one request per group continuously, groups go to the engine with the fewest "
                            "outstanding groups, each finished group to a reward actor at once, scored groups wait in a "
                            "bounded buffer (grpo_dist/orchestrator/stream.py). false: batches of prompts per engine.")
    inflight_updates: bool = Field(False, description="Streaming only: load each new weight version as soon as it "
                                   "arrives, with generation paused and running requests kept (vLLM's pause_generation "
                                   "mode keep); they go on under the new weights, each token recording the version that "
                                   "sampled it (partial rollouts). false: the engine drains first (running groups finish). "
                                   "Merged or full weights (LoRA serving never waits); needs vLLM 0.32.")
    inflight_kv: Literal["recompute", "keep"] = Field(
        "recompute", description="With rollout.inflight_updates, the kept requests' KV cache after a load: recompute = "
        "dropped and recomputed under the new weights (each later token's log-prob is the new version's over its "
        "whole context); keep = reused (no recompute, but later tokens attend to keys/values of the old weights).")
    env: str = Field("single_turn", description="The environment each trajectory talks to (grpo_dist/envs): "
                     "single_turn (one completion per prompt), a built-in (calculator, python_code, guess_number, "
                     "tools), or 'module:Class' / 'file.py:Class' with reset(record) and step(completion) -> EnvStep "
                     "(or a TRL-style class: reset(**row), public methods as tools, get_reward()); its messages are "
                     "appended as tokens with loss mask 0. Batch pipeline: turns in lock step; rollout.streaming: "
                     "each trajectory advances on its own.")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's "
                                       "constructor.")
    max_turns: int = Field(4, gt=0, description="Assistant turns per trajectory at most (multi-turn environments); "
                           "a trajectory cut here has stop_reason max_turns.")
    env_column: Optional[str] = Field(None, description="A dataset column naming each record's environment (a name "
                                      "of rollout.envs or an environment spec); records without a value get rollout.env.")
    envs: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Environments that rollout.env_column "
                                            "names: {name: {env: <spec>, kwargs: {...}}}.")
    max_total_tokens: Optional[int] = Field(None, gt=0, description="Completion tokens over all turns of a trajectory, "
                                            "environment tokens included (TRL's max_completion_length); a trajectory "
                                            "cut here has stop_reason budget. null = max_turns * max_tokens bounds it.")
    max_tool_result_tokens: Optional[int] = Field(None, gt=0, description="Tokens of one tool message's content at "
                                                  "most; longer results are cut in the middle (counted as tool_truncated).")
    tool_timeout_s: Optional[float] = Field(30.0, gt=0, description="Wall-clock limit of one tool call; past it the "
                                            "model reads an error as the result (counted as tool_timeouts).")
    trajectory_timeout_s: Optional[float] = Field(None, gt=0, description="Wall-clock limit of one trajectory "
                                                  "(generation and environment); past it stop_reason timeout.")
    max_env_error_rate: float = Field(0.5, ge=0, le=1, description="Stop the run (checkpoint first) when more than "
                                      "this fraction of trajectories ended as env_error (the environment, agent or "
                                      "rollout function raised) over the last reward.failure_window steps, at once "
                                      "when all of the first step did, and fail a finished run past it (as "
                                      "reward.max_failure_rate does for rewards); the line names the first error. "
                                      "1 = never.")
    max_parallel_calls: int = Field(1, gt=0, description="Tool calls run per turn at most (more get an error "
                                    "result). 1: generation also stops after a call (the parser's stop strings).")
    tool_parser: str = Field("hermes", description="Tool-call format the tool environments parse (grpo_dist/envs/"
                             "parsers.py): hermes = <tool_call>{json}</tool_call>.")
    rollout_fn: Optional[str] = Field(None, description="A user rollout function instead of an environment: "
                                      "'module:fn' / 'file.py:fn', called per trajectory as fn(client, row, "
                                      "**rollout_fn_kwargs) and returning completion_ids, loss_mask, logprobs "
                                      "(optional prompt_ids, reward, info, stop_reason, messages); see "
                                      "grpo_dist/rollout/user_fn.py. Batch pipeline only.")
    rollout_fn_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of rollout.rollout_fn.")
    agent: Optional[str] = Field(None, description="An agent written against the OpenAI API instead of an environment: "
                                 "'module:fn' / 'file.py:fn', called per trajectory as fn(base_url, row, **agent_kwargs) "
                                 "with an OpenAI-compatible endpoint of the rollout worker (chat/completions with "
                                 "tools, completions, models); returns a reward (env_reward) or None; see "
                                 "grpo_dist/rollout/agent.py. Both pipelines (streaming: each request is one engine "
                                 "request, with the version it ran with).")
    agent_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of rollout.agent.")
    agent_tools_prompt: bool = Field(True, description="rollout.agent: state a request's tools in the system prompt in "
                                     "rollout.tool_parser's format when the chat template takes no tools= (false: the "
                                     "agent's own prompt describes them; the answers' tool calls are parsed either way).")
    env_sanity: bool = Field(False, description="Re-render every multi-turn trajectory through the chat template and "
                             "report the first token where the built ids differ (rollout/env_sanity_diff_frac, a warning).")

    @property
    def multi_turn(self) -> bool:
        """Trajectories of several turns: an environment other than single_turn, or a rollout function."""
        return self.env != "single_turn" or bool(self.env_column) or bool(self.rollout_fn) or bool(self.agent)

    @property
    def sampled_budget(self) -> int:
        """Tokens one trajectory samples at most (the length ``algo.max_len`` refers to):
        max_tokens; multi-turn, over all assistant turns, max_total_tokens (environment tokens
        count against it too) else max_turns * max_tokens."""
        if not self.multi_turn:
            return self.max_tokens
        return self.max_total_tokens or self.max_turns * self.max_tokens

    @property
    def overlong_budget(self) -> tuple[int, bool]:
        """``(budget, all_tokens)`` of ``algo.overlong_buffer``: the length that cuts a trajectory
        and whether it counts every completion token. Multi-turn with max_total_tokens: that
        budget over all tokens, environment ones included (as the cut counts them; the sampled
        ones alone may never reach the buffer); else ``sampled_budget`` over sampled tokens."""
        if self.multi_turn and self.max_total_tokens:
            return self.max_total_tokens, True
        return self.sampled_budget, False

    @field_validator("group_size")
    @classmethod
    def _g(cls, v: int) -> int:
        if v < 2:
            raise ValueError("must be >= 2: group-relative advantages need at least two completions")
        return v

    @model_validator(mode="after")
    def _streaming(self):
        if self.streaming and self.backend != "vllm":
            raise ValueError("rollout.streaming needs rollout.backend vllm (its async engine)")
        if self.rollout_fn and (self.env != "single_turn" or self.env_column):
            raise ValueError("rollout.rollout_fn replaces the environment: leave rollout.env and rollout.env_column unset")
        if self.rollout_fn and self.streaming:
            raise ValueError("rollout.rollout_fn runs in the batch pipeline: set rollout.streaming false")
        if self.agent and (self.env != "single_turn" or self.env_column or self.rollout_fn):
            raise ValueError("rollout.agent replaces the environment: leave rollout.env, rollout.env_column and "
                             "rollout.rollout_fn unset")
        if self.inflight_updates and not self.streaming:
            raise ValueError("rollout.inflight_updates needs rollout.streaming: true (the batch pipeline loads between batches)")
        if self.agent_kwargs and not self.agent:
            raise ValueError("rollout.agent_kwargs without rollout.agent")
        return self
