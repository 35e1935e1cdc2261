"""grpo_dist's vLLM general plugin (grpo_dist/rollout/vllm_plugin.py): a CPU engine's worker stops
polling for requests soon after a call instead of burning a core for vLLM's default 1 s, which the
learner needs right after every generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from grpo_dist.rollout import vllm_plugin


def test_the_plugin_is_registered_with_vllm():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("grpo_dist_idle_spin") == "grpo_dist.rollout.vllm_plugin:register"


def test_idle_spin_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    assert vllm_plugin.idle_spin_s() is None
    for raw, want in (("0.05", 0.05), ("0", 0.0), ("", None), ("-1", None), ("soon", None)):
        monkeypatch.setenv(vllm_plugin.ENV, raw)
        assert vllm_plugin.idle_spin_s() == want


def test_patch_sets_the_readers_busy_loop_on_vllms_class(monkeypatch, tmp_path):
    """On vLLM's real SpinCondition: a reader made after the patch polls for the given time only;
    patching again keeps one wrapper (vLLM loads plugins once per process, but may import twice)."""
    import zmq
    from vllm.distributed.device_communicators import shm_broadcast

    # vLLM's own __init__, also where an engine made in this process already loaded the plugin
    init = shm_broadcast.SpinCondition.__init__
    monkeypatch.setattr(shm_broadcast.SpinCondition, "__init__", getattr(init, "__wrapped__", init))
    ctx = zmq.Context()
    try:
        addr = f"ipc://{tmp_path}/notify"
        before = shm_broadcast.SpinCondition(is_reader=True, context=ctx, notify_address=addr)
        assert before.busy_loop_s == 1  # vLLM's own default, which the plugin changes
        assert vllm_plugin.patch_spin_condition(0.05) and vllm_plugin.patch_spin_condition(0.02)
        after = shm_broadcast.SpinCondition(is_reader=True, context=ctx, notify_address=addr)
        assert after.busy_loop_s == 0.02
        explicit = shm_broadcast.SpinCondition(is_reader=True, context=ctx, notify_address=addr, busy_loop_s=3)
        assert explicit.busy_loop_s == 3
    finally:
        ctx.destroy(linger=0)  # closes every socket the conditions made: a failed assert cannot hang term()


def test_cpu_engines_export_the_short_window_unless_the_user_set_one(monkeypatch, tiny_model_dir):
    from grpo_dist.rollout.vllm_engine import engine_kwargs

    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    engine_kwargs(str(tiny_model_dir))
    assert os.environ[vllm_plugin.ENV] == str(vllm_plugin.CPU_IDLE_SPIN_S)
    monkeypatch.setenv(vllm_plugin.ENV, "0.2")
    engine_kwargs(str(tiny_model_dir))
    assert os.environ[vllm_plugin.ENV] == "0.2"


PROBE = textwrap.dedent("""
    import json, os, sys, time
    import psutil

    def set_readers_window(worker, spin):  # runs in the engine's worker process (collective_rpc)
        import gc
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

        # type(), not isinstance: a dead weak proxy among the objects raises on isinstance
        found = [o for o in gc.get_objects() if issubclass(type(o), SpinCondition) and o.is_reader]
        for o in found:
            o.busy_loop_s = spin
        return len(found)

    def busy_share(eng, spec):
        # the share of the 1.5 s after two generate calls the engine's processes kept polling
        for _ in range(2):
            eng.generate([[1, 5, 6, 7]] * 4, spec)
        procs = psutil.Process().children(recursive=True)
        # polling, a process is running or waiting for a core ("R"), even on a busy machine,
        # where its sched_yield loop gets little CPU time; waiting on its socket, it sleeps
        t0, busy, n = time.monotonic(), 0, 0
        while time.monotonic() - t0 < 1.5:
            busy += any(p.status() == psutil.STATUS_RUNNING for p in procs)
            n += 1
            time.sleep(0.005)
        return busy / n

    def main():
        from grpo_dist.rollout.base import SamplingSpec
        from grpo_dist.rollout.vllm_engine import VLLMGenerator

        plugin, control = sys.argv[2], sys.argv[3]
        os.environ["GRPO_DIST_VLLM_IDLE_SPIN_S"] = plugin
        eng = VLLMGenerator(sys.argv[1], enable_lora=False, max_model_len=64, cpu_kvcache_gb=1)
        spec = SamplingSpec(n=4, temperature=1.0, max_tokens=16)
        out = {plugin: busy_share(eng, spec)}
        readers = eng.llm.collective_rpc(set_readers_window, args=(float(control),))
        assert readers and all(n > 0 for n in readers), readers
        out[control] = busy_share(eng, spec)
        eng.close()
        print("IDLE_CPU " + json.dumps(out), flush=True)

    if __name__ == "__main__":
        main()
""")


@pytest.mark.slow
def test_an_idle_cpu_engine_leaves_the_cores_alone(tiny_model_dir, tmp_path):
    """A real vLLM CPU engine (its core and worker in processes of their own): in the 1.5 s after a
    generate call, the engine's processes poll (running or runnable) for under a fifth of it with
    the plugin's window (0.05 s); then, the worker's readers set to vLLM's own window (1 s) in place,
    for about two thirds (the control that shows the measurement can tell, on the same engine: one
    engine start, not two). Sampled as process states, not CPU time: on a busy machine a polling
    loop of sched_yield gets little CPU time (0.16 s of the control's 1 s with three busy processes
    beside it) but stays runnable."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    # (the insecure serialization: the probe sends a function to the worker with collective_rpc)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    p = subprocess.run([sys.executable, str(script), str(tiny_model_dir), "0.05", "1"], capture_output=True,
                       text=True, env=env, timeout=600)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("IDLE_CPU ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    idle = json.loads(line[0][len("IDLE_CPU "):])
    print(f"share of 1.5 s idle the engine polled, by window (s): {idle}")
    assert idle["0.05"] < 0.2, idle
    assert idle["1"] > 0.45, idle


def test_the_logging_config_file_is_deleted_when_the_process_ends(tmp_path):
    """quiet_reload_warnings writes vLLM's logging config to a temporary file for the engine
    processes to read; the process that wrote it deletes it as it exits."""
    code = ("from grpo_dist.rollout.vllm_engine import quiet_reload_warnings\n"
            "env = {}\npath = quiet_reload_warnings(env)\n"
            "import os\nassert os.path.exists(path) and env['VLLM_LOGGING_CONFIG_PATH'] == path\nprint(path)\n")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    path = r.stdout.strip().splitlines()[-1]
    assert path.startswith(str(tmp_path)) and not os.path.exists(path), sorted(os.listdir(tmp_path))
