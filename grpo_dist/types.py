"""Dataclasses that cross process boundaries (Ray actors, object store, checkpoints).

Every object sent between the driver, rollout workers, reward workers and learners is one of
these; none is a loose dict. They hold plain Python lists / tensors so they pickle cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class StopReason(str, Enum):
    """Why a multi-turn trajectory ended: one set of names for the ``stop_reason`` column, the
    ``rollout/stop_reason/<name>`` metrics and the docs. Members are strings (``"done"``...)."""

    DONE = "done"  # the environment ended it after a turn that ended by itself
    LENGTH = "length"  # a turn used all of rollout.max_tokens
    BUDGET = "budget"  # rollout.max_total_tokens (all completion tokens) ran out
    CONTEXT = "context"  # the next turn would not fit in model.max_model_len
    MAX_TURNS = "max_turns"  # rollout.max_turns turns ran and the environment wanted more
    TIMEOUT = "timeout"  # rollout.trajectory_timeout_s of wall clock passed
    ENV_ERROR = "env_error"  # the environment's reset / step raised
    ABORT = "abort"  # the engine aborted the request

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class PromptRecord:
    """One prompt: ``id`` (position in its source), ``prompt`` (model input text) and
    ``columns`` (``answer`` and any other dataset columns, passed on to the rewards)."""

    id: int
    prompt: str
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> Any:
        """The reference answer (``columns["answer"]``), or None when the source has none."""
        return self.columns.get("answer")

    def as_example(self) -> dict[str, Any]:
        """The plain dict form ``{"prompt": ..., "answer": ..., **other_columns}``."""
        return {"prompt": self.prompt, **self.columns}


@dataclass
class Rollout:
    """One sampled trajectory for one prompt: a completion, or several turns with an environment.

    ``completion_ids`` is every token after the prompt, in order: the sampled ones and, in a
    multi-turn trajectory, the environment's messages between turns. ``loss_mask[t]`` is 1 for a
    token the model sampled (the end-of-turn token included) and 0 for one the environment
    added; None means all sampled (single turn). ``logprobs[t]`` is the behaviour policy's
    log-prob of a sampled token (the policy that generated it, adapter ``adapter_version``; 0.0
    where the mask is 0), used for the importance ratio when rollouts are stale and as
    ``old_logp`` when ``num_iterations == 1``. ``completion`` is the text of ``completion_ids``.
    """

    prompt_id: int
    prompt: str
    prompt_ids: list[int]
    completion: str
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort" (the engine aborted it)
    adapter_version: int
    columns: dict[str, Any] = field(default_factory=dict)
    loss_mask: list[int] | None = None
    turns: int = 1
    stop_reason: str | None = None  # multi-turn: a StopReason; None: single turn (see finish_reason)
    # multi-turn: the turns after the prompt ({"role", "content"[, "name"]}: assistant and environment
    # messages, as text), for the W&B conversation table; None: single turn, or not recorded
    messages: list[dict[str, Any]] | None = None
    # multi-turn: the weight version each turn was sampled with, in order (slime keeps them per
    # sample); adapter_version is the oldest of them, the one staleness counts from. None: one turn
    weight_versions: list[int] | None = None
    # an agent trajectory (rollout.agent) whose history was rewritten: its earlier segments, each with
    # its own prompt, trained as samples of their own with this rollout's advantage; None: one segment
    segments: list["Rollout"] | None = None
    # stop_reason env_error: what the environment or agent raised, one line (the run names the first)
    error: str | None = None
    # in-flight loads (rollout.inflight_updates): the weight version that sampled each completion token
    # (environment tokens: the one before them); adapter_version is the oldest. None: all adapter_version
    token_versions: list[int] | None = None

    @property
    def sampled_versions(self) -> list[int]:
        """The weight version of each sampled token (loss mask 1)."""
        vs = self.token_versions or [self.adapter_version] * len(self.completion_ids)
        return vs if self.loss_mask is None else [v for v, m in zip(vs, self.loss_mask) if m]

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def cut_by_length(self) -> bool:
        """Ended by a length limit (``algo.mask_truncated``): a single-turn completion that used
        all of max_tokens; a multi-turn trajectory whose stop_reason is one of
        :data:`LENGTH_STOPS` (not max_turns, timeout or env_error: those the rewards score)."""
        return self.truncated if self.stop_reason is None else self.stop_reason in LENGTH_STOPS

    @property
    def sampled_length(self) -> int:
        """Tokens the model sampled: over all assistant turns (loss mask 1) in a multi-turn trajectory."""
        return len(self.completion_ids) if self.loss_mask is None else int(sum(self.loss_mask))


# stop reasons of a multi-turn trajectory that mean a length limit cut it (grpo_dist/rollout/turns.py)
LENGTH_STOPS = (StopReason.LENGTH, StopReason.BUDGET, StopReason.CONTEXT)
# per-trajectory tool counters (an environment's step info, summed per trajectory into reward
# columns of these names and into rollout metrics)
TOOL_COUNTERS = ("tool_calls", "tool_errors", "tool_timeouts", "tool_malformed", "tool_truncated")


@dataclass
class RolloutGroup:
    """The G completions of one prompt, in sampling order (groups are contiguous downstream)."""

    prompt_id: int
    rollouts: list[Rollout]


# The key under which a record's prompt messages travel in ``columns`` when a chat template
# rendered them: the reward workers pass them as TRL's conversational ``prompts`` (never as a column).
PROMPT_MESSAGES = "_prompt_messages"


@dataclass(frozen=True)
class RewardState:
    """What reward functions get as ``trainer_state`` (TRL passes its ``TrainerState``):
    ``global_step`` is the number of optimizer updates behind the newest policy version that
    generated the batch (TRL's ``state.global_step`` when it generates)."""

    global_step: int


@dataclass
class RewardResult:
    """Scores of a flat list of completions.

    ``total[i]`` is the (weighted) reward used for advantages; ``per_function[name][i]`` is each
    reward function's own value (logged as ``reward/<name>``), None where the function returned
    None (TRL's "not applicable"); ``errors[name]`` counts the completions for which that function
    failed (raised, timed out, returned bad values: they got ``failure_reward``); ``reasons[name]``
    says why, in one line, for the functions that failed in this call.
    """

    total: list[float]
    per_function: dict[str, list[float | None]]
    errors: dict[str, int] = field(default_factory=dict)
    tracebacks: dict[str, str] = field(default_factory=dict)  # name -> its first failure (sent once per worker)
    reasons: dict[str, str] = field(default_factory=dict)  # name -> why it failed in this call (one line)


@dataclass
class TrainBatch:
    """What the learner trains on: N = prompts * G sequences, groups contiguous.

    Token lists are ragged; the learner pads. ``advantages`` (or ``weights`` for the softmax-
    weighted loss) are per sequence.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    behaviour_logprobs: list[list[float]]
    advantages: list[float]
    loss_mask: list[list[float]] | None = None  # per completion token; None = all ones
    adapter_versions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.completion_ids)

    def shard(self, index: int, count: int) -> "TrainBatch":
        """Contiguous shard ``index`` of ``count`` (for several learner ranks)."""
        n = len(self)
        lo, hi = n * index // count, n * (index + 1) // count

        def cut(xs):
            return xs[lo:hi] if xs else xs

        return TrainBatch(
            prompt_ids=cut(self.prompt_ids),
            completion_ids=cut(self.completion_ids),
            behaviour_logprobs=cut(self.behaviour_logprobs),
            advantages=cut(self.advantages),
            loss_mask=cut(self.loss_mask) if self.loss_mask is not None else None,
            adapter_versions=cut(self.adapter_versions),
        )


@dataclass
class AdapterUpdate:
    """Weights sent from the learner to every rollout worker, versioned.

    For LoRA: ``tensors`` holds only the adapter (PEFT state-dict names), ``peft_config`` the
    PEFT ``LoraConfig`` as a dict. For full fine-tuning (``lora.enabled: false``) ``tensors`` holds
    every model parameter (HF names) and ``peft_config`` is None.
    """

    version: int
    tensors: dict[str, Any]
    peft_config: dict[str, Any] | None

    @property
    def is_lora(self) -> bool:
        return self.peft_config is not None

    @property
    def nbytes(self) -> int:
        return int(sum(t.numel() * t.element_size() for t in self.tensors.values()))

