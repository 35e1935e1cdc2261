"""Parts of ``benchmarks/gpu_e2e.py``: the models it trains, the per-role peak-memory sampler and
the TRL run (a subprocess of its own).

Models: ``smollm2`` is the real chat model (``pkg:smollm2-135m-instruct``, converted once by
``grpo_dist.models.gguf_source``); ``qwen2-0.5b`` is Qwen2-0.5B's architecture, randomly initialised
here (the shape of ``benchmarks/gpu_check.py``, nothing downloaded) with the tiny model's character
tokenizer padded to Qwen2's 151936 ids (ids past the characters decode as ``<xN>``: the model is
untrained, this is a throughput workload). The dry run's stand-ins: ``tiny`` (the tests' tiny Llama)
and ``tiny-qwen2`` (a Qwen2 at the tiny Llama's sizes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

ROLES = ("learner", "rollout", "reward")
_ACTOR = {"ray::LearnerActor": "learner", "ray::RolloutActor": "rollout", "ray::StreamingRolloutActor": "rollout",
          "ray::RewardActor": "reward"}


def cache_dir() -> str:
    return os.path.join(os.environ.get("GRPO_DIST_CACHE") or os.path.join(ROOT, ".cache"), "gpu_e2e")


# ------------------------------------------------------------------------------ models

def char_tokenizer(vocab_size: int):
    """The tiny model's character tokenizer with ``vocab_size`` ids (fillers ``<xN>`` past its own)."""
    from tokenizers import models

    from grpo_dist.models.tokenizer import SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer()
    vocab = dict(tok.get_vocab())
    if vocab_size > len(vocab):
        vocab.update({f"<x{i}>": i for i in range(len(vocab), vocab_size)})
        tok.backend_tokenizer.model = models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk"])
    return tok


def qwen2_dir(name: str, dtype: str) -> str:
    """A random Qwen2 of ``gpu_check``'s Qwen2-0.5B shape (``qwen2-0.5b``) or at the tiny Llama's
    sizes (``tiny-qwen2``), with the character tokenizer; made once under the cache."""
    import gpu_check

    out = os.path.join(cache_dir(), f"{name}-{dtype}")
    if os.path.isfile(os.path.join(out, "tokenizer_config.json")):
        return out
    mc = dict(gpu_check.QWEN2_0_5B)
    if name == "tiny-qwen2":
        mc.update(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    tok = char_tokenizer(mc["vocab_size"])
    mc.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
              max_position_embeddings=min(mc["max_position_embeddings"], 4096), sliding_window=4096)
    tmp = out + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    secs = gpu_check.make_model_dir(mc, dtype, tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print(f"[gpu_e2e] made {out} ({name}, {dtype}) in {secs:.0f} s", flush=True)
    return out


def tiny_dir() -> str:
    out = os.path.join(cache_dir(), "tiny-llama")
    if not os.path.isfile(os.path.join(out, "config.json")):
        from grpo_dist.models import make_tiny_model

        tmp = out + f".tmp{os.getpid()}"
        make_tiny_model(tmp, size="tiny", seed=0, log=None)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def model_path(name: str, dtype: str) -> str:
    if name == "smollm2":  # converted once; a GPU machine without network needs this directory carried
        from grpo_dist.models.gguf_source import cache_root, get_model, known_model

        m = known_model("smollm2-135m-instruct")
        done = cache_root() / "models" / f"{m.name}-{m.version}"
        if (done / "config.json").is_file() and (done / "SOURCE.json").is_file():
            return str(done)
        return str(get_model(m.name, log_fn=lambda *a: print("[gpu_e2e]", *a, flush=True)))
    if name == "tiny":
        return tiny_dir()
    return qwen2_dir(name, dtype)


# ------------------------------------------------------------------------------ samplers

class _Poller:
    """While its block runs, a daemon thread calls ``poll()`` every ``interval`` s until it returns True."""

    interval = 0.5

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.started()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.poll():
            self._stop.wait(self.interval)

    def started(self) -> None:
        """Called as the block is entered, before the first poll."""

    def poll(self) -> bool:
        raise NotImplementedError


class FirstStep(_Poller):
    """Start-up of a run: from entering the block to the start of its first step (the moment the
    first line of ``metrics.jsonl`` appears, polled every 0.1 s, less that step's own time)."""

    interval = 0.1

    def __init__(self, metrics_path: str) -> None:
        super().__init__()
        self.path, self.t0, self.wall0, self.seen = metrics_path, 0.0, 0.0, None

    def started(self) -> None:
        self.t0, self.wall0 = time.monotonic(), time.time()

    def poll(self) -> bool:
        try:
            st = os.stat(self.path)
            if st.st_size > 0 and st.st_mtime >= self.wall0 - 1.0:  # not an earlier run's file in the same dir
                self.seen = time.monotonic() - self.t0
        except OSError:
            pass
        return self.seen is not None

    def startup_s(self, first_step_s: Optional[float]) -> Optional[float]:
        if self.seen is None or first_step_s is None:
            return None
        return max(0.0, self.seen - first_step_s)


# ------------------------------------------------------------------------------ peak memory per role

def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process this user can read."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            stat = _read(f"/proc/{d}/stat")
            if stat:
                out[int(d)] = (int(stat.rsplit(")", 1)[1].split()[1]), _read(f"/proc/{d}/cmdline").replace("\0", " "))
    return out


def _descendants(procs: dict[int, tuple[int, str]], root: int) -> set[int]:
    out, changed = {root}, True
    while changed:
        changed = False
        for pid, (ppid, _) in procs.items():
            if pid not in out and ppid in out:
                out.add(pid)
                changed = True
    return out


def role_pids(root: Optional[int] = None) -> dict[int, str]:
    """Each process of a grpo_dist actor (and its children: vLLM's engine core and workers) -> role;
    only those below ``root`` (default this process: the driver whose local Ray cluster runs them;
    another job's actors on the same machine are not counted)."""
    procs = _processes()
    mine = _descendants(procs, os.getpid() if root is None else root)
    roles: dict[int, str] = {}
    for pid, (_, cmd) in procs.items():
        for prefix, role in _ACTOR.items():
            if pid in mine and cmd.startswith(prefix):
                roles[pid] = role
    changed = True
    while changed:  # descendants inherit the role
        changed = False
        for pid, (ppid, _) in procs.items():
            if pid not in roles and ppid in roles:
                roles[pid], changed = roles[ppid], True
    return roles


def gpu_used_mib() -> Optional[dict[int, float]]:
    """pid -> MiB on the GPU (nvidia-smi), None where it cannot say (no nvidia-smi, no pids)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    out = {}
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].replace(".", "").isdigit():
            out[int(parts[0])] = float(parts[1])
    return out


class RolePeaks(_Poller):
    """A thread sampling, every ``interval`` s, the memory of each role's processes: on GPU the
    GPU memory ``nvidia-smi`` reports per process (peak of the sampled sum per role), on CPU each
    process's peak resident set (``VmHWM``, the kernel's high-water mark: exact per process; the
    role's figure is the sum of its processes' peaks)."""

    def __init__(self, gpu: bool, interval: float = 0.5):
        super().__init__()
        self.gpu, self.interval = gpu, interval
        self.hwm: dict[int, tuple[str, float]] = {}  # CPU: pid -> (role, peak GiB)
        self.gpu_peak = {r: 0.0 for r in ROLES}
        self.gpu_seen = False

    def poll(self) -> bool:
        self.sample()
        return False

    def sample(self) -> None:
        roles = role_pids()
        if self.gpu:
            used = gpu_used_mib()
            if used:
                self.gpu_seen = True
                for r in ROLES:
                    total = sum(mib for pid, mib in used.items() if roles.get(pid) == r) / 1024
                    self.gpu_peak[r] = max(self.gpu_peak[r], total)
            return
        for pid, role in roles.items():
            kb = [ln.split()[1] for ln in _read(f"/proc/{pid}/status").splitlines() if ln.startswith("VmHWM:")]
            if kb:
                self.hwm[pid] = (role, max(self.hwm.get(pid, (role, 0.0))[1], int(kb[0]) / 2**20))

    def peaks(self) -> dict[str, Optional[float]]:
        """GiB per role (None: nothing measured for it)."""
        if self.gpu:
            return {r: (self.gpu_peak[r] if self.gpu_seen and self.gpu_peak[r] > 0 else None) for r in ROLES}
        out = {r: sum(g for role, g in self.hwm.values() if role == r) for r in ROLES}
        return {r: (v if v > 0 else None) for r, v in out.items()}


# ------------------------------------------------------------------------------ TRL

def trl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


def run_trl(spec: dict[str, Any], log_dir: str, timeout: float) -> dict[str, Any]:
    """TRL's GRPOTrainer with vLLM colocated on the workload of ``spec`` (its own process)."""
    from grpo_dist.util.ports import free_port

    spec_path, out_path = os.path.join(log_dir, "trl.spec.json"), os.path.join(log_dir, "trl.out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", RANK="0", LOCAL_RANK="0",
               WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("WANDB_SERVICE", None)
    log_path = os.path.join(log_dir, "trl.log")
    try:
        with open(log_path, "w") as log:
            rc = subprocess.run([sys.executable, os.path.abspath(__file__), spec_path, out_path], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != 0 or not os.path.exists(out_path):
        tail = [ln for ln in _read(log_path).splitlines() if ln.strip()][-3:]
        return {"error": f"rc={rc}: {' | '.join(tail)[:400]}", "log": log_path}
    with open(out_path) as f:
        return {**json.load(f), "log": log_path}


def trl_worker(spec_path: str, out_path: str) -> int:
    """One TRL run: per-step wall times after the warm-up steps, to ``out_path``."""
    with open(spec_path) as f:
        s = json.load(f)
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_dist.data.sources import load_prompts
    from grpo_dist.reward.builtin import correctness_reward

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    n = s["prompts"] * s["group"]
    records = load_prompts("builtin:add", limit=max(64, s["steps"] * s["prompts"]))
    data = Dataset.from_list([{"prompt": r.prompt, "answer": r.columns["answer"]} for r in records])
    model = AutoModelForCausalLM.from_pretrained(s["model"], dtype=getattr(torch, s["dtype"]))
    peft = (LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=0.0, target_modules=s["targets"],
                       task_type="CAUSAL_LM") if s["lora"] else None)
    args = GRPOConfig(
        output_dir=s["out_dir"], max_steps=s["steps"], per_device_train_batch_size=n, gradient_accumulation_steps=1,
        num_generations=s["group"], generation_batch_size=n, num_iterations=1, max_completion_length=s["max_tokens"],
        temperature=1.0, learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, beta=s["beta"],
        seed=0, bf16=s["dtype"] == "bfloat16", logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=s["gpu_memory_utilization"],
        vllm_max_model_length=s["max_model_len"])
    trainer = GRPOTrainer(model=model, reward_funcs=[correctness_reward], args=args, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(s["model"]), peft_config=peft,
                          callbacks=[Clock()])
    trainer.train()
    steps = [b - a for a, b in zip(marks, marks[1:])]
    with open(out_path, "w") as f:
        json.dump({"step_s": steps, "trl_version": __import__("trl").__version__}, f)
    return 0


if __name__ == "__main__":  # the TRL subprocess
    sys.exit(trl_worker(sys.argv[1], sys.argv[2]))
