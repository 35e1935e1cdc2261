"""The config tree: defaults, YAML + dotted overrides, validation with one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydantic import BaseModel

from grpo_dist.config import Config, ConfigError, dump_config, load_config, parse_overrides
from grpo_dist.config.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def test_there_are_configs():
    assert any(p.name == "tiny_cpu.yaml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_under_configs_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    # dump -> load is lossless (the data; not the private note of why an auto value was chosen)
    assert load_config(None, yaml_roundtrip(cfg)).model_dump() == cfg.model_dump()


def yaml_roundtrip(cfg):
    import yaml

    return yaml.safe_load(dump_config(cfg))


def test_documented_key_names_exist():
    cfg = Config()
    for dotted in ["model.path", "data.path", "rollout.group_size", "rollout.prompts_per_step", "algo.beta",
                   "algo.clip_low", "algo.clip_high", "algo.preset", "trainer.steps", "trainer.seed",
                   "logging.wandb_mode", "checkpoint.dir", "output_dir"]:
        node = cfg
        for part in dotted.split("."):
            node = getattr(node, part)


def test_every_field_has_a_description():
    def walk(model, prefix=""):
        for name, field in type(model).model_fields.items():
            value = getattr(model, name)
            if isinstance(value, BaseModel):
                yield from walk(value, f"{prefix}{name}.")
            elif name != "output_dir" or prefix == "":
                yield f"{prefix}{name}", field.description

    undocumented = [k for k, d in walk(Config()) if not d and k != "output_dir"]
    assert not undocumented


def test_an_empty_mapping_override_clears_the_files_mapping():
    """``--eval.extra {}`` drops the sets a config names (a merge key by key would keep them all)."""
    root = Path(__file__).resolve().parents[1]
    path = root / "configs" / "smollm2_cpu.yaml"
    assert load_config(path).eval.extra  # the recipe names a second held-out set
    assert load_config(path, ["--eval.extra", "{}"]).eval.extra == {}
    kept = load_config(path, ["--eval.extra", "{sums: 'builtin:add?n=4'}"]).eval.extra
    assert kept["sums"] == "builtin:add?n=4" and len(kept) == len(load_config(path).eval.extra) + 1


def test_overrides_parse_yaml_values():
    o = parse_overrides(["--algo.beta", "0.0", "--rollout.stop=[\"\\n\", \"x\"]", "--trainer.steps", "7",
                         "--logging.wandb_mode", "disabled"])
    assert o == {"algo": {"beta": 0.0}, "rollout": {"stop": ["\n", "x"]}, "trainer": {"steps": 7},
                 "logging": {"wandb_mode": "disabled"}}
    cfg = load_config(ROOT / "configs/tiny_cpu.yaml", ["--algo.beta", "0", "--trainer.steps", "7"])
    assert cfg.algo.beta == 0.0 and cfg.trainer.steps == 7 and cfg.rollout.group_size == 8


def test_packing_off_as_typed():
    """YAML reads a bare `off` as false: `--learner.packing off` (and `packing: off` in a file) mean "off"."""
    assert load_config(None, ["--learner.packing", "off"]).learner.packing == "off"
    assert load_config(None, ["--learner.packing", "group"]).learner.packing == "group"
    with pytest.raises(ConfigError, match="learner.packing"):
        load_config(None, ["--learner.packing", "true"])


@pytest.mark.parametrize("overrides, key, words", [
    (["--rollout.group_size", "1"], "rollout.group_size", ">= 2"),
    (["--algo.bogus", "1"], "algo.bogus", "unknown key"),
    (["--nosuchsection.x", "1"], "nosuchsection", "unknown key"),
    (["--algo.beta", "-0.1"], "algo.beta", "greater than or equal to 0"),
    (["--algo.clip_low", "0"], "algo.clip_low", "greater than 0"),
    (["--algo.clip_low", "1.5"], "algo.clip_low", "less than 1"),
    (["--rollout.temperature", "abc"], "rollout.temperature", "number"),
    (["--learner.micro_batch_size", "5"], "learner.micro_batch_size", "divisible"),
    (["--learner.num_learners", "3"], "learner.num_learners", "divisible"),
    (["--algo.preset", "ppo9000"], "algo.preset", "unknown preset"),
    (["--logging.wandb_mode", "loud"], "logging.wandb_mode", "online"),
    (["--cluster.num_cpus", "1"], "cluster.num_cpus", "CPUs"),
    (["--rollout.max_tokens", "4096"], "rollout.max_tokens", "max_model_len"),
    (["--reward.functions", "[]"], "reward.functions", "at least one"),
    (["--eval.pass_k", "[1, 64]"], "eval.pass_k", "samples_per_prompt"),
    (["--algo.kl_kind", "k9"], "algo.kl_kind", "k3"),
    (["--algo.ref_refresh_every", "5", "--algo.beta", "0"], "algo.ref_refresh_every", "beta > 0"),
    (["--algo.ref_refresh_every", "5", "--algo.preset", "dapo"], "algo.ref_refresh_every", "there is none"),
    (["--trainer.async_rollouts", "true", "--rollout.top_p", "0.9"], "trainer.max_staleness", "top_p"),
    (["--trainer.max_staleness", "2", "--rollout.top_k", "5"], "trainer.max_staleness", "top_k > 0"),
    (["--trainer.max_staleness", "1", "--algo.num_iterations", "2"], "trainer.max_staleness", "not a multiple"),
    (["--trainer.max_staleness", "-1"], "trainer.max_staleness", "must be >= 0 or auto"),
    (["--algo.ref_refresh_mix", "0"], "algo.ref_refresh_mix", "greater than 0"),
    (["--rollout.dtype", "int8"], "rollout.dtype", "bfloat16"),
    (["--algo.ref_refresh_mix", "1.5"], "algo.ref_refresh_mix", "less than or equal to 1"),
    (["--rollout.streaming", "true", "--rollout.engine_in_process", "true"], "rollout.engine_in_process",
     "async engine"),
])
def test_bad_config_is_one_line_naming_the_key(overrides, key, words):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/tiny_cpu.yaml", overrides)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{key}:"), msg
    assert words in msg, msg


@pytest.mark.parametrize("overrides,expect", [
    ([], True),  # CPU: the engine core in the rollout actor's process
    (["--rollout.streaming", "true"], False),  # vLLM's async engine: a process of its own
    (["--cluster.rollout_gpus", "1"], False),  # GPU: vLLM's default
    (["--rollout.engine_in_process", "false"], False),
])
def test_engine_in_process_resolves_by_device_and_pipeline(overrides, expect):
    assert load_config(ROOT / "configs/tiny_cpu.yaml", overrides).rollout.engine_in_process is expect


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="--config: invalid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml")


def test_presets_fill_only_unset_fields():
    cfg = load_config(None, ["--algo.preset", "dapo"])
    assert (cfg.algo.clip_high, cfg.algo.beta, cfg.algo.agg, cfg.algo.dynamic_sampling) == (0.28, 0.0, "token-mean", True)
    cfg = load_config(None, ["--algo.preset", "dapo", "--algo.clip_high", "0.3", "--algo.beta", "0.01"])
    assert (cfg.algo.clip_high, cfg.algo.beta, cfg.algo.agg) == (0.3, 0.01, "token-mean")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates(name):
    cfg = load_config(None, ["--algo.preset", name])
    for k, v in PRESETS[name].items():
        assert getattr(cfg.algo, k) == v


def test_async_rollouts_is_max_staleness_one_step_ahead():
    c = load_config(ROOT / "configs/tiny_cpu.yaml", ["--trainer.async_rollouts", "true"])
    assert c.trainer.max_staleness == 1 and c.trainer.async_rollouts
    c = load_config(ROOT / "configs/tiny_cpu.yaml", ["--trainer.async_rollouts", "true", "--algo.num_iterations", "2"])
    assert c.trainer.max_staleness == 2  # one step = num_iterations adapter versions
    c = load_config(ROOT / "configs/tiny_cpu.yaml", ["--trainer.max_staleness", "2"])
    assert c.trainer.async_rollouts  # the learner takes the behaviour log-probs as pi_old
    c = load_config(ROOT / "configs/tiny_cpu.yaml")
    assert c.trainer.max_staleness == 0 and not c.trainer.async_rollouts


@pytest.mark.parametrize("overrides, line", [
    (["--trainer.step", "3"], "trainer.step: unknown key; did you mean trainer.steps?"),
    (["--trainer.group_size", "4"], "trainer.group_size: unknown key; did you mean rollout.group_size?"),
    (["--lora.rank", "4"], "lora.rank: unknown key; did you mean lora.r?"),
    (["--num_generations", "8"], "num_generations: unknown key: this is rollout.group_size (TRL; G, completions "
                                 "per prompt)"),
    (["--trainer.max_steps", "8"], "trainer.max_steps: unknown key: this is trainer.steps (TRL; steps, not epochs: "
                                   "the prompts repeat, reshuffled, as long as it runs)"),
    (["--actor_rollout_ref.actor.optim.lr", "1e-6"], "actor_rollout_ref.actor.optim.lr: unknown key: this is "
                                                     "learner.lr (verl)"),
    (["--data.train_batch_size", "16"], "data.train_batch_size: unknown key: this is rollout.prompts_per_step "
                                        "(verl; prompts per step; a step trains on prompts_per_step x group_size "
                                        "completions)"),
])
def test_an_unknown_key_says_what_it_is_called_here(overrides, line):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert str(e.value) == line


def test_a_verl_yaml_section_is_named_by_its_dotted_key(tmp_path):
    p = tmp_path / "verl.yaml"
    p.write_text("actor_rollout_ref:\n  rollout:\n    n: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == ("actor_rollout_ref.rollout.n: unknown key: this is rollout.group_size (verl; G, "
                            "completions per prompt)")


def test_every_trl_and_verl_name_maps_to_a_real_key_and_the_docs_show_the_table():
    from grpo_dist.config.aliases import ALIASES, markdown_table
    from grpo_dist.config.load import config_keys

    keys = set(config_keys())
    assert {target for target, _, _ in ALIASES.values()} <= keys
    assert not set(ALIASES) & keys - {"data.shuffle"}  # a name that is ours too is no alias (verl's data.shuffle is)
    for name in ("num_generations", "max_completion_length", "epsilon", "epsilon_high", "loss_type", "reward_weights",
                 "beta", "actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.clip_ratio_high"):
        assert name in ALIASES, name
    page = (ROOT / "docs" / "coming-from-trl-verl.md").read_text()
    section = page[page.index("## The option table"):]
    assert markdown_table() in section
