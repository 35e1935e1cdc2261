"""The ``adapters:`` list and ``--sweep`` (issue 53 item 1): each adapter's config resolved from the
run's, what an adapter may set and what it may not, one line naming the key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_dist.config import ConfigError, adapter_configs, load_config

DEMO = "configs/tiny_cpu.yaml"


def test_without_adapters_a_run_is_one_adapter_as_before():
    cfg = load_config(DEMO)
    assert cfg.adapters == [] and adapter_configs(cfg) == {}


def test_a_sweep_makes_one_adapter_per_value_named_as_written():
    cfg = load_config(DEMO, ["--output_dir", "runs/x"], sweep=["learner.lr=1e-3,3e-3,1e-2"])
    adapters = adapter_configs(cfg)
    assert list(adapters) == ["learner.lr=1e-3", "learner.lr=3e-3", "learner.lr=1e-2"]
    assert [a.learner.lr for a in adapters.values()] == [1e-3, 3e-3, 1e-2]
    assert adapters["learner.lr=3e-3"].output_dir == "runs/x/adapters/learner.lr=3e-3"
    one = adapters["learner.lr=1e-3"]
    assert one.rollout.group_size == cfg.rollout.group_size and one.model.path == cfg.model.path
    assert one.adapters == []  # an adapter's own config lists no adapters


def test_several_sweeps_cross():
    cfg = load_config(DEMO, sweep=["learner.lr=1e-3,3e-3", "trainer.seed=0,1"])
    names = list(adapter_configs(cfg))
    assert names == ["learner.lr=1e-3,trainer.seed=0", "learner.lr=1e-3,trainer.seed=1",
                     "learner.lr=3e-3,trainer.seed=0", "learner.lr=3e-3,trainer.seed=1"]
    assert adapter_configs(cfg)[names[3]].trainer.seed == 1


def test_an_adapters_list_overrides_only_what_an_adapter_owns():
    cfg = load_config(DEMO, {"adapters": [
        {"name": "a"},
        {"name": "b", "lora": {"r": 4, "alpha": 8}, "rollout": {"group_size": 4, "temperature": 0.7},
         "algo": {"beta": 0.04}, "data": {"path": "builtin:add?max_operand=9"}, "trainer": {"steps": 3}},
        {"name": "c", "algo": {"preset": "dr_grpo"}},
    ]})
    a, b, c = adapter_configs(cfg).values()
    assert a.lora.r == cfg.lora.r and b.lora.r == 4 and b.rollout.group_size == 4 and b.algo.beta == 0.04
    assert b.trainer.steps == 3 and a.trainer.steps == cfg.trainer.steps and b.rollout.max_tokens == cfg.rollout.max_tokens
    assert c.algo.preset == "dr_grpo"


@pytest.mark.parametrize("adapters, says", [
    ([{"name": "a", "model": {"path": "x"}}], "adapters.a.model: an adapter sets keys of"),
    ([{"name": "a", "learner": {"zero_stage": 2}}], "adapters.a.learner.zero_stage: not per adapter"),
    ([{"name": "a", "rollout": {"num_workers": 3}}], "adapters.a.rollout.num_workers: not per adapter"),
    ([{"name": "a", "learner": {"lr": -1}}], "adapters.a.learner.lr: Input should be greater than 0"),
    ([{"name": "a", "rollout": {"group_size": 1}}], "adapters.a.rollout.group_size: must be >= 2"),
    ([{"name": "a"}, {"name": "a"}], "adapters.a: two adapters have this name"),
    ([{"name": "a/b"}], "adapters.0.name: 'a/b' must be a name of"),
    (["a"], "adapters.0: Input should be a valid dictionary"),
])
def test_a_bad_adapter_is_one_line_naming_its_key(adapters, says):
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, {"adapters": adapters})
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flags, says", [
    (["model.path=a,b"], "--sweep model.path: not a key an adapter can set"),
    (["learner.lr"], "--sweep 'learner.lr': expected KEY=V1,V2"),
    (["learner.lr=1e-3,1e-3"], "--sweep learner.lr: values must be distinct"),
])
def test_a_bad_sweep_is_one_line(flags, says):
    with pytest.raises(ConfigError, match="^" + says.replace("(", r"\(").replace(".", r"\.")):
        load_config(DEMO, sweep=flags)


@pytest.mark.parametrize("override, key", [
    ({"rollout": {"streaming": True}}, "rollout.streaming"),
    ({"rollout": {"adapter_mode": "lora"}}, "rollout.adapter_mode"),
    ({"learner": {"zero_stage": 3}}, "adapters: learner.zero_stage 3"),
])
def test_what_several_adapters_cannot_share_yet_is_refused(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(DEMO, override, sweep=["learner.lr=1e-3,3e-3"])


def test_print_config_shows_every_adapter_resolved(tmp_path):
    out = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", DEMO, "--sweep",
                          "learner.lr=1e-3,3e-3", "--print-config"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import yaml

    docs = list(yaml.safe_load_all(out.stdout))
    assert len(docs) == 3 and [d["learner"]["lr"] for d in docs[1:]] == [1e-3, 3e-3]
    assert docs[2]["output_dir"].endswith("adapters/learner.lr=3e-3")
    assert "--- # adapter learner.lr=3e-3" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", DEMO, "--sweep",
                          "learner.lr=1e-3,-1", "--print-config"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "learner.lr" in bad.stderr


def test_an_adapter_view_gives_the_same_handle_for_the_same_actor_and_a_new_one_for_a_replacement():
    """The batch pipeline tells a replaced engine by identity (``chunk.actor is view.actors[rank]``):
    a view that wrapped each actor anew sent every chunk twice (generated again at collect time,
    with the newer weights: staleness read 0 at max_staleness 1)."""
    from grpo_dist.cluster.adapter_view import ROLLOUT_METHODS, AdapterView

    class Method:
        def __init__(self, log, name):
            self.log, self.name = log, name

        def remote(self, *args, **kwargs):
            self.log.append((self.name, kwargs))

    class Actor:
        def __init__(self):
            self.log = []

        def __getattr__(self, name):
            return Method(self.log, name)

    class Group:
        actors = [Actor(), Actor()]

    view = AdapterView(Group, "a", ROLLOUT_METHODS)
    first = view.actors
    assert view.actors[0] is first[0] and view.actors[1] is first[1]
    Group.actors[1] = Actor()  # replaced
    assert view.actors[0] is first[0] and view.actors[1] is not first[1]
    view.actors[0].generate.remote([1], keys=None)
    view.actors[0].heartbeat.remote()
    assert Group.actors[0].log == [("generate", {"adapter": "a", "keys": None}), ("heartbeat", {})]
