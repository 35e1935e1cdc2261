"""Pre-flight: every input of a run checked on the driver before any Ray actor starts.

Each problem is a :class:`~grpo_dist.config.ConfigError` with one line naming the config key
(the CLI prints it and exits with code 2):

* the model directory: ``config.json`` and the tokenizer load (an empty or ``{}`` config is an
  error here, not a pydantic error inside an actor minutes later), ``max_model_len`` fits the
  model's positions, every ``*.safetensors`` is whole (header vs file size) and every shard an
  index names is there;
* every reward function resolves (file/module/function exist), can be called as
  ``fn(prompts, completions, **columns)``, and finds the dataset columns it needs (``answer``
  for ``correctness``; any parameter without a default for a plug-in);
* prompts: none empty, none longer than ``data.max_prompt_tokens`` (default
  ``model.max_model_len - rollout.max_tokens``) tokens; longer ones stop the run or, with
  ``data.overlong_prompts: drop``, are dropped, counted and logged;
* W&B online (``logging.wandb_mode``): a key (``WANDB_API_KEY`` or wandb's netrc login) of the
  form wandb accepts, and not refused by the server; a server out of reach means offline, said in
  one line (``run/monitor/wandb_check.py``);
* multi-turn: one instance of each environment is made and reset on a record (its keyword
  arguments, tools and their schemas), and its opening (system prompt, tool schemas, examples,
  the question) leaves ``rollout.max_tokens`` in ``model.max_model_len``.

:func:`prepared_data` returns the checked (and filtered) records; the result is cached per
config, so the CLI's early check and ``Run.start`` load the data once (the cache ignores the run's identity: run id, resolved output_dir).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_dist.config import Config, ConfigError, dump_config
from grpo_dist.envs.registry import check_envs, env_factory
from grpo_dist.rollout.agent import load_agent
from grpo_dist.rollout.user_fn import load_rollout_fn
from grpo_dist.reward.columns import PIPELINE_COLUMNS, check_rewards, plan_eval
from grpo_dist.types import PROMPT_MESSAGES

log = logging.getLogger("grpo_dist.run.preflight")


@dataclass
class Checked:
    """What pre-flight found: the records to use and what it did to them."""

    train: list[Any]
    evals: list[Any]
    max_prompt_tokens: int
    dropped: dict[str, int] = field(default_factory=dict)  # "train"/"eval" -> rows dropped as overlong
    longest: dict[str, int] = field(default_factory=dict)  # "train"/"eval" -> longest kept prompt (tokens)
    reward_columns: dict[str, list[str]] = field(default_factory=dict)  # reward name -> required columns
    extra: dict[str, list[Any]] = field(default_factory=dict)  # eval.extra: set name -> records


_CACHE: dict[str, Checked] = {}


def prepared_data(cfg: Config, log_fn: Callable[[str], None] = print) -> tuple[list[Any], list[Any]]:
    """Training and held-out records after every check (cached per config in this process)."""
    c = check(cfg, log_fn)
    return c.train, c.evals


def extra_eval_sets(cfg: Config, log_fn: Callable[[str], None] = print) -> dict[str, list[Any]]:
    """The checked records of each ``eval.extra`` set (name -> records; cached with the rest)."""
    return check(cfg, log_fn).extra


def check(cfg: Config, log_fn: Callable[[str], None] = print) -> Checked:
    """Run every check; raise ConfigError (one line) on the first problem."""
    key = _cache_key(cfg)
    if key in _CACHE:
        return _CACHE[key]
    from grpo_dist.run.monitor.wandb_check import wandb_mode
    from grpo_dist.run.prepare import load_data, load_extra, prepare_model

    wandb_mode(cfg.logging, log_fn)  # online: the key's form, then the server's answer (bounded); offline if out of reach
    prepare_model(cfg, log_fn)
    _check_model_json(cfg)  # the cheap checks first: no transformers/torch import before them
    rewards = check_rewards(cfg)
    try:  # the environment class resolves as the rollout workers will make it
        env_factory(cfg.rollout.env, cfg.rollout.env_kwargs)
    except ValueError as e:
        raise ConfigError(f"rollout.env: {_first_line(e)}") from None
    if cfg.rollout.rollout_fn:  # the user rollout function loads as the rollout workers will load it
        try:
            load_rollout_fn(cfg.rollout.rollout_fn)
        except ValueError as e:
            raise ConfigError(f"rollout.rollout_fn: {_first_line(e)}") from None
    if cfg.rollout.agent:  # the agent function loads as the rollout workers will load it
        try:
            load_agent(cfg.rollout.agent)
        except ValueError as e:
            raise ConfigError(f"rollout.agent: {_first_line(e)}") from None
    train, evals = load_data(cfg, log_fn)
    extra = load_extra(cfg)
    if extra and not evals:
        raise ConfigError("eval.extra: the extra held-out sets are evaluated beside the main one, and data.eval_path "
                          "gives none")
    splits = [("train", "data.path", cfg.data.path, train), ("eval", "data.eval_path", cfg.data.eval_path, evals)]
    splits += [(f"extra:{name}", f"eval.extra.{name}", cfg.eval.extra[name], recs) for name, recs in extra.items()]
    for split, key_name, source, records in splits:
        if records:
            _check_empty(records, key_name, source)
            # an eval set lacking a column is scored with the rewards that need none (reward.columns.plan_eval)
            if split == "train" or not plan_eval(rewards, records).used:
                _check_columns(records, rewards, key_name, source)
    tokenizer = check_model(cfg)
    try:  # multi-turn: the environments the records name, and a prefix-preserving chat template
        made = check_envs(cfg.rollout, tokenizer, list(train or []) + list(evals or [])
                          + [r for v in extra.values() for r in v])
    except ValueError as e:
        raise ConfigError(f"rollout.env: {_first_line(e)}") from None
    room = cfg.model.max_model_len - cfg.rollout.max_tokens
    _check_openings(cfg, tokenizer, made, room)
    limit = cfg.data.max_prompt_tokens or room
    out = Checked(train=train, evals=evals, max_prompt_tokens=limit)
    for split, key_name, source, records in splits:
        if not records:
            continue
        kept, lens = _check_lengths(cfg, tokenizer, records, limit, key_name, source, log_fn)
        out.dropped[split] = len(records) - len(kept)
        out.longest[split] = max(lens) if lens else 0
        if split == "train":
            out.train = kept
        elif split == "eval":
            out.evals = kept
        else:
            out.extra[split.split(":", 1)[1]] = kept
    out.reward_columns = {name: sorted(cols) for name, (_, cols) in rewards.items()}
    _CACHE[key] = _CACHE[_cache_key(cfg)] = out  # also as prepare_model left it (pkg: -> converted dir)
    return out


def _cache_key(cfg: Config) -> str:
    """What the checks depend on: not the run's identity (``trainer.run_id``, the absolute
    ``output_dir`` the run resolves), so the CLI's check and the run's start share one result."""
    # model_copy(update=...) does not validate: an assignment would (full weights with a shared_dir
    # need output_dir inside it, and output_dir is blanked here)
    c = cfg.model_copy(deep=True, update={"output_dir": "", "trainer": cfg.trainer.model_copy(update={"run_id": None}),
                                          "checkpoint": cfg.checkpoint.model_copy(update={"dir": None})})
    return dump_config(c)


# ------------------------------------------------------------------------------------- model

def _check_model_json(cfg: Config) -> None:
    from grpo_dist.hub import local_model_dir  # a hub id: its snapshot in the HF cache

    path = local_model_dir(cfg.model.path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"model.path: no model at {path} (no config.json)")
    try:
        raw = json.loads(cfg_file.read_text() or "null")
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path: {cfg_file} is not valid JSON ({_first_line(e)})") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"model.path: {cfg_file} is empty (expected a transformers model config with "
                          f"'model_type' and 'architectures')")
    if "model_type" not in raw:
        raise ConfigError(f"model.path: {cfg_file} has no 'model_type' (not a transformers model config)")
    _check_weights(path)


def _check_weights(path) -> None:
    """Every ``*.safetensors`` whole (its size what its header says, the header JSON) and every
    shard an index names present: a truncated download fails here naming the file, not minutes
    later inside an engine's traceback."""
    from grpo_dist.util.safetensors_header import AGAIN, WeightsError, read_header

    for f in sorted(path.glob("*.safetensors")):
        try:
            read_header(f)
        except WeightsError as e:
            raise ConfigError(f"model.path: {e}") from None
    for index in sorted(path.glob("*.safetensors.index.json")):
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"model.path: {index} is not a shard index ({_first_line(e)}); {AGAIN}") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ConfigError(f"model.path: {index} names {len(missing)} of {len(shards)} shards that are not in "
                              f"{path} (first: {missing[0]}); {AGAIN}")


def check_model(cfg: Config) -> Any:
    """Load the model's config and tokenizer from ``model.path``; return the tokenizer."""
    _check_model_json(cfg)
    from grpo_dist.hub import local_model_dir

    path = local_model_dir(cfg.model.path)
    from transformers import AutoConfig, AutoTokenizer

    try:
        mcfg = AutoConfig.from_pretrained(str(path), trust_remote_code=cfg.model.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any load failure is the user's model directory
        raise ConfigError(f"model.path: cannot load the model config in {path}: {_first_line(e)}") from None
    positions = getattr(mcfg, "max_position_embeddings", None)
    if isinstance(positions, int) and positions < cfg.model.max_model_len:
        raise ConfigError(f"model.max_model_len: {cfg.model.max_model_len} exceeds the model's "
                          f"max_position_embeddings {positions}")
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=cfg.model.trust_remote_code)
    except Exception as e:  # noqa: BLE001
        files = ", ".join(sorted(f.name for f in path.glob("tokenizer*"))) or "none"
        raise ConfigError(f"model.path: cannot load the tokenizer in {path} (tokenizer files there: {files}): "
                          f"{_first_line(e).rstrip(': ')}") from None
    return tok


def _check_columns(records: list[Any], rewards: dict[str, tuple[Any, set[str]]], key: str, source: Any) -> None:
    wanted: dict[str, str] = {}
    for name, (_, cols) in rewards.items():
        for c in sorted(cols):
            wanted.setdefault(c, f"reward function {name!r}")
    for col, who in wanted.items():
        if col in PIPELINE_COLUMNS:
            continue
        missing = [i for i, r in enumerate(records) if r.columns.get(col) is None]
        if missing:
            have = sorted(k for k in records[missing[0]].columns if k != PROMPT_MESSAGES)
            hint = " (set data.answer_column or data.column_mapping)" if col == "answer" else ""
            raise ConfigError(f"{key}: {who} needs column {col!r}, missing in {len(missing)} of {len(records)} "
                              f"rows of {source} (first: row {missing[0]}; columns there: {have}){hint}")


# ------------------------------------------------------------------------------------- prompts

def _check_empty(records: list[Any], key: str, source: Any) -> None:
    empty = [i for i, r in enumerate(records) if not str(r.prompt).strip()]
    if empty:
        raise ConfigError(f"{key}: {len(empty)} of {len(records)} prompts in {source} are empty "
                          f"(first: row {records[empty[0]].id})")


def _check_lengths(cfg: Config, tokenizer: Any, records: list[Any], limit: int, key: str, source: Any,
                   log_fn: Callable[[str], None]) -> tuple[list[Any], list[int]]:
    """Token lengths as the rollout workers tokenise (special tokens unless a chat template
    already holds them); drop or stop on prompts over ``limit``."""
    add_special = not cfg.data.chat_template
    ids = tokenizer([r.prompt for r in records], add_special_tokens=add_special)["input_ids"]
    lens = [len(x) for x in ids]
    over = [i for i, n in enumerate(lens) if n > limit]
    why = ("data.max_prompt_tokens" if cfg.data.max_prompt_tokens else
           f"model.max_model_len {cfg.model.max_model_len} - rollout.max_tokens {cfg.rollout.max_tokens}")
    if not over:
        return records, lens
    first = over[0]
    if cfg.data.overlong_prompts == "error":
        raise ConfigError(f"{key}: {len(over)} of {len(records)} prompts in {source} are longer than {limit} "
                          f"tokens ({why}; first: row {records[first].id}, {lens[first]} tokens); shorten them, "
                          f"raise model.max_model_len or set data.overlong_prompts: drop")
    if len(over) == len(records):
        raise ConfigError(f"{key}: all {len(records)} prompts in {source} are longer than {limit} tokens ({why})")
    skip = set(over)
    msg = (f"{key}: dropped {len(over)} of {len(records)} prompts longer than {limit} tokens ({why}; "
           f"data.overlong_prompts: drop)")
    log.warning(msg)
    log_fn(msg)
    return [r for i, r in enumerate(records) if i not in skip], [n for i, n in enumerate(lens) if i not in skip]


def _check_openings(cfg: Config, tokenizer: Any, made: dict[str, tuple[Any, Any, Any]], room: int) -> None:
    """An environment's opening (system prompt, tool schemas, examples, the question) is the
    prompt a trajectory starts from: it must leave ``rollout.max_tokens`` in ``model.max_model_len``
    (measured on the record pre-flight reset each environment on)."""
    from grpo_dist.envs.chat import encode_opening

    quiet = logging.getLogger("transformers.tokenization_utils_base")  # "longer than the maximum" (said below)
    for name, (record, env, opening) in made.items():
        if not opening:
            continue  # the record's prompt as it is: measured with the others
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            n = len(encode_opening(tokenizer, opening, getattr(env, "tools", None), getattr(env, "parser", None)))
        finally:
            quiet.setLevel(level)
        if n > room:
            raise ConfigError(f"rollout.env: environment {name!r} opens with {n} tokens on record {record.id} (its "
                              f"system prompt, tool schemas, examples and the question), more than model.max_model_len "
                              f"{cfg.model.max_model_len} - rollout.max_tokens {cfg.rollout.max_tokens} = {room}; "
                              f"shorten the opening or raise model.max_model_len")


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
