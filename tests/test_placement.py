"""Placement plans and the per-node feasibility check (pure: no Ray)."""

from __future__ import annotations

import pytest

from grpo_dist.config.placement import PlacementError, check_feasible, plan
from grpo_dist.config import ConfigError, load_config


def cfg_with(**cluster):
    return load_config(None, {"rollout": {"num_workers": 2}, "learner": {"num_learners": 2, "micro_batch_size": 8},
                              "reward": {"num_workers": 1}, "cluster": cluster})


def test_disaggregated_plan_has_one_group_per_role_with_config_bundles():
    groups = {g.name: g for g in plan(cfg_with(learner_cpus=1.0, learner_gpus=1.0, learner_resources={"a": 1},
                                               rollout_strategy="SPREAD", learner_strategy="STRICT_SPREAD"))}
    assert set(groups) == {"learner", "rollout", "reward"}
    assert groups["learner"].bundles == [{"CPU": 1.0, "GPU": 1.0, "a": 1.0}] * 2
    assert groups["learner"].strategy == "STRICT_SPREAD" and groups["rollout"].strategy == "SPREAD"
    assert groups["rollout"].bundles == [{"CPU": 0.5}] * 2 and groups["reward"].bundles == [{"CPU": 0.25}]


def test_colocated_plan_shares_bundles_between_learner_and_rollout():
    groups = {g.name: g for g in plan(cfg_with(layout="colocated", learner_gpus=0.5, rollout_gpus=0.5))}
    assert set(groups) == {"learner+rollout", "reward"}
    assert groups["learner+rollout"].bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2
    assert groups["learner+rollout"].roles == ("learner", "rollout")


def test_colocated_needs_one_engine_per_learner_rank():
    with pytest.raises(ConfigError, match=r"^cluster.layout: colocated .*rollout.num_workers \(3\)"):
        load_config(None, {"rollout": {"num_workers": 3}, "cluster": {"layout": "colocated"}})


NODES = {"n1" + "0" * 30: {"CPU": 2.0, "GPU": 1.0}, "n2" + "0" * 30: {"CPU": 2.0, "GPU": 1.0}}


def test_feasible_plan_passes():
    check_feasible(plan(cfg_with(learner_gpus=1.0, learner_strategy="STRICT_SPREAD")), NODES)


def test_a_bundle_no_node_holds_fails_naming_bundle_and_nodes():
    with pytest.raises(PlacementError) as e:
        check_feasible(plan(cfg_with(learner_gpus=2.0)), NODES)
    msg = str(e.value)
    assert "\n" not in msg
    assert "bundle 0 of the learner group {CPU: 0.5, GPU: 2} fits on no node" in msg
    assert "node n1000000 free {CPU: 2, GPU: 1}" in msg


def test_strict_pack_that_fits_no_single_node_fails():
    with pytest.raises(PlacementError, match="STRICT_PACK"):
        check_feasible(plan(cfg_with(learner_gpus=1.0, learner_strategy="STRICT_PACK")), NODES)


def test_strict_spread_needs_enough_capable_nodes():
    with pytest.raises(PlacementError, match="needs 2 nodes .* the cluster has 1"):
        check_feasible(plan(cfg_with(learner_resources={"big": 1}, learner_strategy="STRICT_SPREAD")),
                       {"a" * 32: {"CPU": 4.0, "big": 1.0}, "b" * 32: {"CPU": 4.0}})


def test_total_demand_above_the_cluster_fails_even_if_each_bundle_fits():
    with pytest.raises(PlacementError, match="need 3 GPU in all, the cluster has 2"):
        check_feasible(plan(cfg_with(learner_gpus=1.0, rollout_gpus=0.5)), NODES)


def test_free_resources_are_reported_but_do_not_decide():
    """A busy cluster (nothing free now) is not infeasible: the bounded wait handles it."""
    busy = {k: {"CPU": 0.0, "GPU": 0.0} for k in NODES}
    check_feasible(plan(cfg_with()), NODES, busy)
