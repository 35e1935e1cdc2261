"""A chaos soak (``make soak``, not in CI; issue 42.5): the tiny config trained through the real CLI
(``grpo-dist train``) for ``--minutes`` while a seeded schedule, one fault at a time, kills and stops
(SIGSTOP; then SIGCONT after a few seconds, or left for the heartbeat to find) rollout engines and
reward actors, kills a learner rank, fills the output directory's disk once and frees it, and sends
Ctrl-C (SIGINT) once. A run that stops is resumed (``--checkpoint.resume auto``, the time left as
``trainer.max_minutes``). Then an unfaulted run of the same seed trains the same number of steps.

The report (``<out>/soak.json`` and a markdown table on stdout): each fault, when it was sent, whether
and how the run detected it (a replacement logged, or the run's exit line) and how long that took;
groups lost over the whole run (goal 0); held-out accuracy beside the unfaulted run's.

The output directory is a size-limited tmpfs (``mount -t tmpfs``: root) so that a filler file fills
it; without root the disk fault is left out with a line saying so. Usage::

    python benchmarks/soak.py --minutes 20 --seed 0 --out runs/soak
    python benchmarks/soak.py --minutes 3 --kinds kill_engine,disk_full,sigint   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_report import groups_lost, markdown, read_steps, resumed_from  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ("ray::RolloutActor", "VLLM::")
TITLES = {"engine": ENGINE, "reward": ("ray::RewardActor",), "learner": ("ray::LearnerActor",)}
# what each fault does: (role, signal, SIGCONT after s or None); the run-level ones have role None
KINDS = {"kill_engine": ("engine", signal.SIGKILL, None), "stop_engine": ("engine", signal.SIGSTOP, None),
         "pause_engine": ("engine", signal.SIGSTOP, 5.0), "kill_reward": ("reward", signal.SIGKILL, None),
         "stop_reward": ("reward", signal.SIGSTOP, None), "pause_reward": ("reward", signal.SIGSTOP, 5.0),
         "kill_learner": ("learner", signal.SIGKILL, None), "disk_full": (None, None, None),
         "sigint": (None, signal.SIGINT, None)}
FULL = ["kill_engine", "stop_engine", "pause_engine", "kill_reward", "stop_reward", "pause_reward",
        "kill_learner", "disk_full", "sigint"]
REPLACED = "-- replacing it (restart "


class Segment:
    """One ``grpo-dist train`` process of the run; its stdout/stderr in the soak's log directory."""

    def __init__(self, index: int, argv: list[str], logs: Path):
        self.index, self.t0 = index, time.monotonic()
        self.err_path, self.out_path = logs / f"segment{index}.stderr", logs / f"segment{index}.stdout"
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=open(self.out_path, "w"), stderr=open(self.err_path, "w"),
                                     env={k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
                                     start_new_session=True)

    def text(self) -> str:
        return self.err_path.read_text(errors="replace") + self.out_path.read_text(errors="replace")

    def replaced(self) -> int:
        return self.err_path.read_text(errors="replace").count(REPLACED)

    def procs(self, titles: tuple) -> list[psutil.Process]:
        """The run's live processes whose title starts with one of ``titles`` (Ray: ``ray::Role.method``)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for p in children:
            try:
                t = " ".join(p.cmdline()).strip()  # (not one closing: the run is ending)
                if t.startswith(titles) and ".close" not in t and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def replacement(self, before: int) -> str:
        """The replacement line after the first ``before`` ones (what the driver logged)."""
        lines = [ln for ln in self.err_path.read_text(errors="replace").splitlines() if REPLACED in ln]
        line = lines[before] if len(lines) > before else ""
        return line.split("WARNING", 1)[-1].strip(" :-")[-300:]

    def last_line(self) -> str:
        """The driver's last words (``error:``, ``interrupted``, an exception line) and how many
        tracebacks its stderr holds."""
        text = self.err_path.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        keep = [ln for ln in lines if ln.startswith(("error:", "interrupted", "stopped")) or
                (ln[:1].isalpha() and ln.split(":")[0].endswith(("Error", "Exception")))]
        n = text.count("Traceback (most recent call last)")
        return (keep or lines or [""])[-1][:300] + (f" ({n} traceback(s) in stderr)" if n else "")

    def kill_tree(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args, self.rng = args, random.Random(args.seed)
        self.base = Path(args.out).resolve()
        self.run_dir, self.logs = self.base / "run", self.base / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.minutes * 60
        self.segments: list[Segment] = []
        self.faults: list[dict] = []
        self.stops: list[dict] = []  # every end of a segment before the last: why, at which step, resumed from
        self.tmpfs = False
        self.startup_s: float | None = None  # the first segment's start to its first step: a resume's estimate

    # ----------------------------------------------------------------------------- the run
    def overrides(self) -> list[str]:
        a = self.args
        return ["--model.path", str(ROOT / "models/tiny-add"), "--trainer.seed", str(a.seed),
                "--learner.num_learners", str(a.learners), "--checkpoint.every", str(a.checkpoint_every),
                "--cluster.max_restarts", "100", "--cluster.heartbeat_timeout_s", str(a.heartbeat_timeout),
                "--logging.progress", "false", "--logging.wandb_mode", "offline"]

    def launch(self, resume: bool) -> Segment:
        startup = self.startup_s / 60 if self.startup_s else self.args.startup_minutes
        left = max(0.5, (self.deadline - time.monotonic()) / 60 - startup)
        train = [sys.executable, "-m", "grpo_dist.cli", "train"]
        if resume:
            argv = [*train, "--config", str(self.run_dir / "config.yaml"), "--checkpoint.resume", "auto"]
        else:
            argv = [*train, "--config", "configs/tiny_cpu.yaml", "--output_dir", str(self.run_dir),
                    "--trainer.steps", "100000", *self.overrides()]
        seg = Segment(len(self.segments), [*argv, "--trainer.max_minutes", f"{left:.2f}"], self.logs)
        self.segments.append(seg)
        print(f"[soak] segment {seg.index} started ({'resume' if resume else 'fresh'}, max_minutes {left:.2f})",
              flush=True)
        return seg

    def steps(self) -> int:
        return len(read_steps(self.run_dir))

    def wait(self, cond, seg: Segment, limit: float) -> bool:
        """Poll ``cond`` until true (True) or ``limit`` s pass or the segment ends (False)."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if cond():
                return True
            if seg.proc.poll() is not None:
                return bool(cond())
            time.sleep(0.2)
        return False

    # ----------------------------------------------------------------------------- faults
    def schedule(self) -> list[str]:
        kinds = self.args.kinds.split(",") if self.args.kinds else list(FULL)
        if "disk_full" in kinds and not self.tmpfs:
            print("[soak] not root or no tmpfs: the disk_full fault is left out", flush=True)
            kinds = [k for k in kinds if k != "disk_full"]
        self.rng.shuffle(kinds)
        return kinds

    def inject(self, seg: Segment, kind: str) -> dict:
        role, sig, cont = KINDS[kind]
        rec = {"kind": kind, "t": round(time.monotonic() - self.t_start), "step": self.steps(), "segment": seg.index}
        if kind == "disk_full":
            return self.fill_disk(seg, rec)
        if kind == "sigint":
            os.kill(seg.proc.pid, signal.SIGINT)
            rec["target"] = "driver"
            return self.await_exit(seg, rec, time.monotonic())
        targets = seg.procs(TITLES[role])
        if not targets:
            rec.update(detected=False, outcome="no target process found")
            return rec
        p = self.rng.choice(targets)
        rec["target"] = " ".join(p.cmdline()).strip()[:40]
        before, t0 = seg.replaced(), time.monotonic()
        os.kill(p.pid, sig)
        if role == "learner":  # not replaceable: the run stops, the soak resumes it
            return self.await_exit(seg, rec, t0)
        if cont is not None:  # a pause shorter than the heartbeat's limit: nothing to replace
            time.sleep(cont)
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.wait(lambda: False, seg, self.args.heartbeat_timeout + 5)
            n = seg.replaced() - before
            rec.update(detected=n > 0, expected=False, outcome=f"resumed after {cont:.0f} s; {n} replacement(s)")
            return rec
        got = self.wait(lambda: seg.replaced() > before, seg, self.args.heartbeat_timeout + 240)
        rec.update(detected=got, expected=True, detect_s=round(time.monotonic() - t0, 1) if got else None,
                   outcome=seg.replacement(before) if got else f"no replacement: {seg.last_line()}")
        if not got:
            if seg.proc.poll() is not None:
                rec["outcome"] = f"the run exited {seg.proc.returncode}: {seg.last_line()}"
            try:  # never leave a process stopped that the run did not find
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return rec

    def await_exit(self, seg: Segment, rec: dict, t0: float, limit: float | None = None) -> dict:
        """The run stops on this fault: detected when the driver says so (its first ``error:``,
        ``interrupted`` or traceback line), then its exit."""
        said = lambda: any(ln.startswith(("error:", "interrupted", "Traceback")) for ln in
                           seg.err_path.read_text(errors="replace").splitlines())
        limit = limit or self.args.heartbeat_timeout + 300
        end = time.monotonic() + limit
        seen = None
        while seg.proc.poll() is None and time.monotonic() < end:
            if seen is None and said():
                seen = time.monotonic()
            time.sleep(0.2)
        if seg.proc.poll() is None:
            rec.update(detected=False, expected=True, outcome=f"still running after {limit:.0f} s")
            return rec
        done = time.monotonic()
        seen = seen or (done if said() else None)
        rec.update(detected=True, expected=True, detect_s=round((seen or done) - t0, 1),
                   outcome=f"exit {seg.proc.returncode} after {done - t0:.0f} s: {seg.last_line()}")
        return rec

    def fill_disk(self, seg: Segment, rec: dict) -> dict:
        filler, t0 = self.run_dir / "filler.bin", time.monotonic()
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
        except OSError:
            pass
        rec["target"] = f"output_dir ({self.args.disk_mb} MiB tmpfs, {shutil.disk_usage(self.run_dir).free} B free)"
        self.await_exit(seg, rec, t0, limit=self.args.disk_full_s)  # it notices at its next write (each step's metrics)
        filler.unlink()
        rec["freed_after_s"] = round(time.monotonic() - t0, 1)
        return rec

    # ----------------------------------------------------------------------------- the soak
    def mount(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.disk_mb}m", "tmpfs", str(self.run_dir)])
            self.tmpfs = r.returncode == 0

    def unmount(self) -> None:
        if self.tmpfs:
            shutil.copytree(self.run_dir, self.base / "run_copy", dirs_exist_ok=True)
            for _ in range(20):  # the run's W&B service and reaper leave a few seconds after its driver
                if subprocess.run(["umount", str(self.run_dir)], capture_output=True).returncode == 0:
                    break
                time.sleep(1)
            else:
                subprocess.run(["umount", "-l", str(self.run_dir)], check=False)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            (self.base / "run_copy").rename(self.run_dir)

    def ended(self, seg: Segment, why: str) -> None:
        """A segment stopped; the steps it had logged (a resume replays those after its checkpoint)."""
        self.stops.append({"segment": seg.index, "why": why, "rc": seg.proc.returncode, "step": self.steps(),
                           "line": seg.last_line()})

    def run(self) -> dict:
        self.t_start, self.load = time.monotonic(), [os.getloadavg()]
        self.mount()
        plan, seg = self.schedule(), self.launch(resume=False)
        self.plan = plan  # what is left of it at the end was not injected (out of time)
        pending: tuple[dict, float] | None = None  # the last fault and when it was sent
        spacing = self.args.spacing
        try:
            while True:
                if seg.proc.poll() is not None:  # a stop: planned (the last fault) or not
                    seg.kill_tree()  # what of its session is left (Ray's processes)
                    if seg.proc.returncode == 0 or len(self.segments) >= self.args.max_segments:
                        break
                    last = self.faults[-1] if self.faults else {}
                    planned = last.get("segment") == seg.index and last.get("detected")
                    self.ended(seg, last["kind"] if planned else "unplanned")
                    seg = self.launch(resume=True)
                    continue
                n = self.steps()  # a fault once the run trains again (a step since the last one) and spaced
                ok = self.wait(lambda: self.steps() > n, seg, 900)
                if ok and pending:  # the last fault's time until the run trained a step again
                    pending[0]["back_s"], pending = round(time.monotonic() - pending[1], 1), None
                if ok and self.startup_s is None:
                    self.startup_s = time.monotonic() - seg.t0
                if not plan or time.monotonic() > self.deadline - 90:
                    continue
                self.wait(lambda: False, seg, self.rng.uniform(0, spacing))  # (returns early if the run ends)
                if not ok or seg.proc.poll() is not None or time.monotonic() > self.deadline - 90:
                    continue  # (no fault once the run may be finishing: its evaluation after, its close)
                pending = ({}, time.monotonic())
                rec = self.inject(seg, plan.pop(0))
                pending = (rec, pending[1]) if rec.get("expected", True) else None  # (a pause: the run went on)
                self.faults.append(rec)
                print(f"[soak] {json.dumps(rec)}", flush=True)
            seg.proc.wait()
        finally:
            for s in self.segments:
                if s.proc.poll() is None:
                    s.kill_tree()
            self.result = self.summary()
            self.unmount()
        return self.result

    def summary(self) -> dict:
        for stop in self.stops:  # the step the next segment resumed from
            nxt = self.segments[stop["segment"] + 1] if stop["segment"] + 1 < len(self.segments) else None
            stop["resumed_from"] = resumed_from(nxt.out_path.read_text(errors="replace")) if nxt else None
        steps = read_steps(self.run_dir)
        s = json.loads((self.run_dir / "summary.json").read_text()) if (self.run_dir / "summary.json").exists() else {}
        return {"seed": self.args.seed, "minutes": round((time.monotonic() - self.t_start) / 60, 1),
                "steps": len(steps), "segments": len(self.segments), "faults": self.faults,
                "not_injected": list(getattr(self, "plan", [])), "cpu": cpu(),
                "stops": self.stops, "load_avg": [*self.load, os.getloadavg()],  # (1, 5, 15 min): start, end
                "groups_lost": groups_lost(steps, *shape(self.run_dir)), "accuracy": {k: s.get(k) for k in (
                    "sampled_accuracy_before", "sampled_accuracy_after", "greedy_accuracy_after")},
                "last_rc": self.segments[-1].proc.returncode if self.segments else None}


def cpu() -> str:
    """The CPU model and count (lscpu)."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    info = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    return f"{info.get('Model name', '?').strip()}, {info.get('CPU(s)', '?').strip()} CPUs"


def shape(run_dir: Path) -> tuple[int, int]:
    """The run's prompts per step and completions per prompt (its config.yaml)."""
    r = yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]
    return int(r["prompts_per_step"]), int(r["group_size"])


def unfaulted(args: argparse.Namespace, steps: int, overrides: list[str]) -> dict:
    """The same seed and config without faults, ``steps`` steps."""
    out = Path(args.out).resolve() / "unfaulted"
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "grpo_dist.cli", "train", "--config", "configs/tiny_cpu.yaml", "--output_dir",
            str(out), "--trainer.steps", str(steps), *overrides]
    t0 = time.monotonic()
    with open(Path(args.out) / "logs" / "unfaulted.log", "w") as log:
        rc = subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    s = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return {"rc": rc, "minutes": round((time.monotonic() - t0) / 60, 1), "steps": len(read_steps(out)),
            "groups_lost": groups_lost(read_steps(out), *shape(out)),
            "accuracy": {k: s.get(k) for k in ("sampled_accuracy_before", "sampled_accuracy_after",
                                               "greedy_accuracy_after")}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/soak")
    p.add_argument("--kinds", default="", help=f"comma-separated faults (default: {','.join(FULL)})")
    p.add_argument("--learners", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--heartbeat-timeout", type=float, default=30)
    p.add_argument("--disk-mb", type=int, default=256)
    p.add_argument("--disk-full-s", type=float, default=120, help="how long the disk stays full at most")
    p.add_argument("--startup-minutes", type=float, default=1.5, help="a segment's start, before its first step")
    p.add_argument("--spacing", type=float, default=30, help="at most this many s between a step after the "
                   "last fault and the next fault (uniform)")
    p.add_argument("--max-segments", type=int, default=20)
    p.add_argument("--no-unfaulted", action="store_true")
    args = p.parse_args()
    base = Path(args.out).resolve()
    if base.exists():
        shutil.rmtree(base)
    soak = Soak(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` of the soak: its runs stopped, the report kept
    try:
        report = {"soak": soak.run()}
    except SystemExit:  # stopped: what the soak did so far
        report = {"soak": getattr(soak, "result", {}), "stopped": True}
        args.no_unfaulted = True
    if not args.no_unfaulted and report["soak"]["steps"]:
        report["unfaulted"] = unfaulted(args, report["soak"]["steps"], soak.overrides())
    (base / "soak.json").write_text(json.dumps(report, indent=2))
    if report["soak"]:
        print("\n".join(markdown(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
