"""Several Ray nodes on this machine (``ray.cluster_utils.Cluster``), the real stack on them.

One simulated cluster serves the module:

    head  CPU 1, {reward_slot: 1}            the driver (this process) and the reward actor
    n1    CPU 1, GPU 1 (declared), {trainer: 1, gen: 1}
    n2    CPU 1, GPU 1 (declared), {trainer: 1, gen: 1}
    n3    CPU 2, {gen: 2, driver_slot: 1}     the rollout engines (PACK: the only node that holds
                                              both), and the driver of a submitted job

Learner ranks ask for {trainer: 1} with STRICT_SPREAD, so the DeepSpeed rendezvous crosses nodes
(n1 <-> n2); rollout engines ask for {gen: 1} with PACK, so they start together on n3 and, when n3
is removed, Ray reschedules their bundles onto n1 and n2. The declared GPUs need no hardware: they
test GPU bundle placement only (the training runs are on the CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import e2e
import pytest

from grpo_dist.config import load_config
from grpo_dist.run.monitor.base import Monitor
from grpo_dist.train import train

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from grpo_dist.util.ports import free_port
    from grpo_dist.cluster.ray_utils import shutdown_ray

    shutdown_ray()
    dash = free_port()
    def ports():  # every node on this machine needs its own agent ports (the defaults collide)
        return {"dashboard_agent_listen_port": free_port(), "metrics_export_port": free_port()}

    c = Cluster(initialize_head=True, connect=True,
                head_node_args={"num_cpus": 1, "resources": {"reward_slot": 1}, "include_dashboard": True,
                                "dashboard_host": "127.0.0.1", "dashboard_port": dash, **ports()})
    c.dashboard_url = f"http://127.0.0.1:{dash}"
    nodes = {"head": c.head_node}
    for name, args in (("n1", dict(num_cpus=1, num_gpus=1, resources={"trainer": 1, "gen": 1})),
                       ("n2", dict(num_cpus=1, num_gpus=1, resources={"trainer": 1, "gen": 1})),
                       ("n3", dict(num_cpus=2, resources={"gen": 2, "driver_slot": 1}))):
        nodes[name] = c.add_node(**args, **ports())
    c.wait_for_nodes()
    c.nodes_by_name = nodes
    yield c
    ray.shutdown()
    c.shutdown()


def node_names(cluster) -> dict[str, str]:
    return {n.node_id: name for name, n in cluster.nodes_by_name.items()}


def where(group) -> list[str]:
    import ray

    return [i["node_id"] for i in ray.get([a.node_info.remote() for a in group.actors])]


def multinode_config(model_dir, out, **over):
    base = {
        "output_dir": str(out), "model": {"path": str(model_dir), "make_if_missing": None},
        "rollout": {"num_workers": 2, "prompts_per_step": 4, "group_size": 4, "max_tokens": 5},
        "learner": {"num_learners": 2, "micro_batch_size": 8, "zero_stage": 2},
        "trainer": {"steps": 4, "eval_before_after": False},
        "checkpoint": {"every": 1, "keep": 2}, "logging": {"progress": False, "sample_table_every": 0},
        "cluster": {"num_cpus": None, "learner_resources": {"trainer": 1}, "learner_strategy": "STRICT_SPREAD",
                    "rollout_resources": {"gen": 1}, "rollout_strategy": "PACK",
                    "reward_resources": {"reward_slot": 1}, "actor_start_timeout_s": 300},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return load_config(ROOT / "configs/tiny_cpu.yaml", base)


class Hook(Monitor):
    """The run's real monitors, plus a callback after each logged step (fault injection)."""

    def __init__(self, inner, on_step):
        self.inner, self.on_step = inner, on_step
        self.wandb_dir = getattr(inner, "wandb_dir", None)

    def start(self, total_steps):
        self.inner.start(total_steps)

    def log(self, metrics, step):
        self.inner.log(metrics, step)
        self.on_step(step)

    def log_table(self, name, columns, rows, step):
        self.inner.log_table(name, columns, rows, step)

    def summary(self, values):
        self.inner.summary(values)

    def close(self):
        self.inner.close()


def trainer_with_hook(cfg, on_step):
    """A Run whose monitor calls ``on_step(step)`` when a step is logged (before its checkpoint);
    ``run.rec`` records every batch."""
    from grpo_dist.run.prepare import make_monitor
    from grpo_dist.run.run import Run

    rec = e2e.Recorder()
    trainer = Run(cfg, callbacks=(rec,))
    trainer.monitor = Hook(make_monitor(trainer.cfg), on_step)
    trainer.rec = rec
    return trainer


def test_gpu_and_colocated_bundles_land_where_layout_and_strategy_say(cluster):
    """Placement only (probe actors in the bundles, no engines): learner GPU bundles on the two
    GPU nodes, one each (STRICT_SPREAD); colocated learner rank i shares a node with engine i."""
    from grpo_dist.run.workers import RewardActor
    from grpo_dist.cluster.placement import actor_specs, place
    from grpo_dist.cluster.ray_utils import ActorGroup

    names = node_names(cluster)
    cfg = load_config(None, {"learner": {"num_learners": 2}, "rollout": {"num_workers": 2},
                             "cluster": {"learner_gpus": 1, "learner_strategy": "STRICT_SPREAD",
                                         "layout": "colocated", "rollout_resources": {"gen": 1}}})
    placement = place(cfg)
    try:
        spec = actor_specs(cfg)
        groups = {role: ActorGroup.create(role, RewardActor, [(cfg.reward,)] * 2, spec=spec[role],
                                          placement=placement) for role in ("learner", "rollout")}
        import ray

        info = {role: ray.get([a.node_info.remote() for a in g.actors]) for role, g in groups.items()}
        learner_nodes = [names[i["node_id"]] for i in info["learner"]]
        assert sorted(learner_nodes) == ["n1", "n2"]
        assert all(len(i["gpu_ids"]) == 1 for i in info["learner"]), info["learner"]
        assert [names[i["node_id"]] for i in info["rollout"]] == learner_nodes  # colocated: same bundle
        for g in groups.values():
            g.kill()
    finally:
        placement.remove()


def test_infeasible_request_fails_in_seconds_naming_the_bundle(cluster):
    import time

    from grpo_dist.cluster.placement import PlacementError, place

    cfg = load_config(None, {"cluster": {"learner_gpus": 2}})
    t0 = time.perf_counter()
    with pytest.raises(PlacementError) as e:
        place(cfg)
    assert time.perf_counter() - t0 < 10
    assert "bundle 0 of the learner group {CPU: 0.5, GPU: 2} fits on no node" in str(e.value)
    assert str(e.value).count("free {") == 4  # every node's free resources


def test_busy_cluster_waits_bounded_and_says_what_for(cluster, caplog):
    """Feasible but taken: another placement group holds both {trainer: 1} slots. The learner group
    waits (logging what for) and gives up after cluster.placement_timeout_s, releasing what it
    reserved."""
    import logging

    from ray.util.placement_group import placement_group, remove_placement_group

    from grpo_dist.cluster.placement import place
    from grpo_dist.cluster.ray_utils import ClusterError

    import ray

    other = placement_group([{"trainer": 1}] * 2, strategy="STRICT_SPREAD")
    ray.get(other.ready(), timeout=60)
    cfg = load_config(None, {"learner": {"num_learners": 2}, "rollout": {"num_workers": 1},
                             "cluster": {"learner_resources": {"trainer": 1}, "learner_strategy": "STRICT_SPREAD",
                                         "placement_timeout_s": 3}})
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_dist.cluster"):
            with pytest.raises(ClusterError, match=r"placement groups learner \(2 x \{CPU: 0.5, trainer: 1\}, "
                                                   r"STRICT_SPREAD\) not placed within cluster.placement_timeout_s=3 s"):
                place(cfg, poll_s=1.0)
        assert "waiting for placement groups learner" in caplog.text
    finally:
        remove_placement_group(other)
    assert not [pg for pg in ray.util.placement_group_table().values()
                if pg["name"].startswith("grpo_dist-") and pg["state"] != "REMOVED"]


def test_shared_dir_is_checked_on_every_node(cluster, tmp_path):
    from grpo_dist.cluster.shared_dir import check_shared_dir
    from grpo_dist.config import ConfigError

    assert check_shared_dir(str(tmp_path), "run1") == len(cluster.nodes_by_name)
    assert not (tmp_path / ".grpo_dist-check" / "run1").exists() and not list((tmp_path / ".grpo_dist-check").iterdir())
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.raises(ConfigError, match="^cluster.shared_dir: the driver cannot write"):
        check_shared_dir(str(blocked), "run1")


# Every node's packaged copy of the job's working_dir; an actor's first start on a node makes that
# node's runtime-env agent unpack it with overwrite (rmtree, then unzip).
_WARM_ENTRYPOINT = (
    "import ray; from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A; ray.init(); "
    "f = ray.remote(num_cpus=0)(lambda: 1); "
    "print(sum(ray.get([f.options(scheduling_strategy=A(n['NodeID'], soft=False)).remote() "
    "for n in ray.nodes() if n['Alive']])), 'nodes')")


def _submit(client, entrypoint: str, env: dict):
    import time

    for attempt in range(30):  # the job server may briefly have no agent between two jobs
        try:
            return client.submit_job(entrypoint=entrypoint, entrypoint_resources={"driver_slot": 1}, runtime_env={
                "working_dir": str(ROOT), "excludes": [".venv", ".cache", "runs", "models", ".git", "wandb"],
                "env_vars": env})
        except RuntimeError as e:
            if "No available agent" not in str(e) or attempt == 29:
                raise
            time.sleep(2)


def _wait(client, job, timeout: float):
    import time

    from ray.job_submission import JobStatus

    deadline = time.time() + timeout
    while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.time() < deadline, client.get_job_logs(job)[-3000:]
        time.sleep(2)
    return client.get_job_status(job)


def _job(cluster, entrypoint: str, env: dict, timeout: float = 600.0):
    """Submit ``entrypoint`` with this repo as working_dir, its driver on n3; wait; (status, logs, info).

    A simulation artefact is handled first. The simulated nodes share one session directory, so
    the job's package is unpacked into one path, and each node's runtime-env agent re-unpacks it
    (rmtree, then unzip) the first time a process of the job starts on that node: a driver
    importing a module in that moment finds it missing (ModuleNotFoundError, CI of session 11). A
    warm-up job with the same working_dir touches every node first; each agent caches the URI and
    does not unpack it again. On a real cluster each node unpacks into its own disk."""
    import sys

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    warm = _submit(client, f'cd / && {sys.executable} -c "{_WARM_ENTRYPOINT}"', {})
    assert _wait(client, warm, 300) == "SUCCEEDED", client.get_job_logs(warm)[-3000:]
    job = _submit(client, entrypoint, env)
    status = _wait(client, job, timeout)
    return status, client.get_job_logs(job), client.get_job_info(job)


def test_job_submitted_to_the_cluster_writes_every_output_to_the_requested_dir(cluster, pretrained_model_dir,
                                                                               tmp_path):
    """`ray job submit` with the driver on a worker node (n3, not the head): with the submitter's
    directory in the job's environment (what launch/submit_job.sh passes) a relative output_dir
    resolves against it, and the whole run lands there (without it the driver refuses the relative
    path: tests/test_outputs.py)."""
    import sys

    from grpo_dist.util.paths import SUBMIT_DIR_ENV

    # Simulation artefact: every "node" here shares one session dir, so each node's runtime-env agent
    # unpacks the job's working_dir into the same path and replaces the driver's cwd under it
    # (wandb.init then fails in os.getcwd()). On a real cluster each node has its own disk. The
    # driver therefore starts from a directory of its own; it is still a submitted job (Ray's job
    # environment), and output_dir is still relative.
    stable = tmp_path / "driver-cwd"
    stable.mkdir()
    cmd = (f"cd {stable} && {sys.executable} -m grpo_dist.cli train --config {ROOT / 'configs/tiny_cpu.yaml'} "
           f"--cluster.address auto "
           f"--cluster.num_cpus null --model.path {pretrained_model_dir} --model.make_if_missing null "
           f"--output_dir runs/job --trainer.steps 2 --trainer.eval_before_after false --logging.progress false "
           f"--rollout.backend hf --rollout.num_workers 1 --rollout.prompts_per_step 4 --rollout.group_size 4 "
           f"--learner.micro_batch_size 16 --checkpoint.every 1 --cluster.rollout_resources '{{gen: 1}}' "
           f"--cluster.learner_resources '{{trainer: 1}}'")
    status, logs, info = _job(cluster, cmd, {"HF_HUB_OFFLINE": "1", SUBMIT_DIR_ENV: str(tmp_path)})
    assert status == "SUCCEEDED", logs[-3000:]
    assert node_names(cluster)[info.driver_node_id] == "n3"
    out = tmp_path / "runs" / "job"
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert (out / "adapter" / "adapter_model.safetensors").is_file() and (out / "config.yaml").is_file()
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    assert (out / "checkpoints" / "step_000002" / "trainer_state.json").is_file()
    assert list((out / "wandb").glob("offline-run-*")), "the W&B offline run is in output_dir too"


@pytest.fixture(scope="module")
def lost_rollout_node_run(cluster, pretrained_model_dir, tmp_path_factory):
    """4 steps on 3 nodes; after step 2 the rollout engines' node is removed."""
    out = tmp_path_factory.mktemp("multinode-run")
    seen: dict = {}

    def on_step(step):
        if step == 2:
            seen["before"] = {role: where(g) for role, g in
                              (("learner", trainer.workers.learner), ("rollout", trainer.workers.rollout),
                               ("reward", trainer.workers.reward))}
            cluster.remove_node(cluster.nodes_by_name["n3"])

    trainer = trainer_with_hook(multinode_config(pretrained_model_dir, out), on_step)
    summary = train(trainer)
    seen["after"] = {"rollout": where(trainer.workers.rollout)}
    yield trainer, summary, seen
    trainer.close()


def test_roles_land_on_their_nodes_and_learners_rendezvous_across_nodes(cluster, lost_rollout_node_run):
    _, _, seen = lost_rollout_node_run
    names = node_names(cluster)
    before = {role: [names[n] for n in nodes] for role, nodes in seen["before"].items()}
    assert sorted(before["learner"]) == ["n1", "n2"]  # two ranks, two nodes: a cross-node process group
    assert before["rollout"] == ["n3", "n3"]
    assert before["reward"] == ["head"]


def test_lost_rollout_node_engines_are_rescheduled_and_no_group_is_lost(cluster, lost_rollout_node_run):
    import ray

    from grpo_dist.data import PromptStream

    trainer, summary, seen = lost_rollout_node_run
    names = node_names(cluster)
    assert summary["steps"] == 4
    assert sorted(names[n] for n in seen["after"]["rollout"]) == ["n1", "n2"]
    assert trainer.history[-1]["cluster/restarts"] == 2.0
    # every prompt group of the stream trained exactly once, in order: none lost, none doubled
    stream = PromptStream(trainer.train_records, seed=trainer.cfg.trainer.seed, shuffle=trainer.cfg.data.shuffle)
    expected = [r.id for _ in range(4) for r in stream.next_batch(4)]
    assert trainer.rec.prompt_ids == expected and len(expected) == 16
    # every engine, on whichever node, serves the final adapter version
    assert [h["version"] for h in ray.get([a.health.remote() for a in trainer.workers.rollout.actors])] == [4, 4]


def test_one_output_dir_on_the_driver_holds_the_whole_run(lost_rollout_node_run):
    trainer, summary, _ = lost_rollout_node_run
    out = Path(trainer.cfg.output_dir)
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    assert ckpts == ["step_000003", "step_000004"]
    last = out / "checkpoints" / "step_000004"
    names = {p.relative_to(last).as_posix() for p in last.rglob("*") if p.is_file()}
    # both ranks' ZeRO-2 optimizer partitions (written on n1 and n2) are here, plus rank 0's model states
    assert {p for p in names if "optim_states" in p} == {f"global_step4/zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
                                                         for r in range(2)}
    assert "global_step4/mp_rank_00_model_states.pt" in names and "trainer_state.json" in names
    assert "adapter/adapter_config.json" in names
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    assert (out / "run.json").is_file() and (out / "config.yaml").is_file()
    assert summary["wandb_dir"] and Path(summary["wandb_dir"]).is_relative_to(out)


def test_lost_learner_node_stops_naming_checkpoint_and_resume_command(cluster, lost_rollout_node_run,
                                                                      pretrained_model_dir, tmp_path):
    """After the first run, n3 is gone and the engines' former node is replaced by n4; then the node
    of learner rank 0 is removed after step 2: the run stops with one message naming the last
    checkpoint (step 1: the step-2 save was the call that found the rank dead) and the command that
    resumes. On the smaller cluster that resume is refused in seconds (the learner group needs two
    {trainer: 1} nodes); with a node added back it continues from step 1 to the end."""
    from grpo_dist.cluster.placement import PlacementError
    from grpo_dist.util.ports import free_port
    from grpo_dist.run.run import Run, TrainingError

    lost_rollout_node_run[0].close()  # its learners hold n1 and n2
    cluster.nodes_by_name["n4"] = cluster.add_node(num_cpus=2, resources={"gen": 2}, dashboard_agent_listen_port=free_port())
    cluster.wait_for_nodes()
    out = tmp_path / "run"

    def on_step(step):
        if step == 2:
            cluster.remove_node(cluster.nodes_by_name.pop("n1"))

    trainer = trainer_with_hook(multinode_config(pretrained_model_dir, out, trainer={"steps": 3}), on_step)
    try:
        with pytest.raises(TrainingError) as e:
            train(trainer)
    finally:
        trainer.close()
    msg = str(e.value)
    assert "learner worker" in msg and "\n" not in msg
    assert f"the last checkpoint is {out / 'checkpoints' / 'step_000001'} (step 1)" in msg
    command = f"grpo-dist train --config {out / 'config.yaml'} --checkpoint.resume auto"
    assert msg.endswith(f"resume with: {command}")

    resumed_cfg = load_config(out / "config.yaml", {"checkpoint": {"resume": "auto"}})
    with pytest.raises(PlacementError, match="learner group .*STRICT_SPREAD.* needs 2 nodes"):
        Run(resumed_cfg).start()
    cluster.nodes_by_name["n5"] = cluster.add_node(num_cpus=1, resources={"trainer": 1}, dashboard_agent_listen_port=free_port())
    cluster.wait_for_nodes()
    trainer = Run(resumed_cfg)
    try:
        trainer.start()
        assert trainer.step == 1 and trainer.cfg.trainer.run_id == json.loads((out / "run.json").read_text())["run_id"]
        summary = train(trainer)
        # the records cover the whole run: step 1 from the checkpoint, steps 2 and 3 trained now
        assert summary["steps"] == 3 and [h["step"] for h in trainer.history] == [1.0, 2.0, 3.0]
        assert len(summary["reward_curve"]) == 3
    finally:
        trainer.close()
