"""Proof that every node sees ``cluster.shared_dir`` at the same path.

The driver writes a token file; a zero-CPU task pinned to each alive node reads it and writes the
node's own marker; the driver then reads every marker. A node that cannot see the directory
(not mounted there, a node-local path, another filesystem) is named in a one-line error before
any actor starts.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from grpo_dist.config import ConfigError


def _visit(path: str, token: str, node_id: str) -> str:
    """On one node: '' if the driver's token is visible there (and this node's marker written)."""
    root = Path(path)
    try:
        if (root / "driver").read_text() != token:
            return f"sees {root} but not the driver's marker (a different filesystem at the same path)"
        (root / node_id).write_text(token)
    except OSError as e:
        return f"cannot use {root}: {e.__class__.__name__}: {e}"
    return ""


def check_shared_dir(shared_dir: str, run_id: str, timeout_s: float = 120.0) -> int:
    """Raise ConfigError naming the first node that cannot see ``shared_dir``; returns the number
    of nodes checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    base = Path(shared_dir)
    root = base / ".grpo_dist-check" / f"{run_id}-{uuid.uuid4().hex[:6]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        (root / "driver").write_text(token)
    except OSError as e:
        raise ConfigError(f"cluster.shared_dir: the driver cannot write {base}: {e}") from None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        visit = ray.remote(num_cpus=0, max_retries=0)(_visit)
        refs = [visit.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(root), token, n["NodeID"]) for n in nodes]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for n, ref in zip(nodes, refs):
            where = f"node {n['NodeID'][:8]} ({n.get('NodeManagerAddress', '?')})"
            if ref not in ready:
                raise ConfigError(f"cluster.shared_dir: {where} did not answer the check within {timeout_s:g} s")
            problem = ray.get(ref)
            if not problem and (root / n["NodeID"]).is_file():
                continue
            problem = problem or f"wrote a marker into {root} that the driver cannot see"
            raise ConfigError(f"cluster.shared_dir: {where} {problem}; mount {base} at the same path on every node")
        return len(nodes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_storage(cfg) -> None:
    """``cluster.shared_dir`` (when set) is seen by every node; full-weight training on several
    nodes needs one (its learners write the checkpoints themselves)."""
    from grpo_dist.cluster.ray_utils import alive_nodes

    c = cfg.cluster
    if c.shared_dir:
        check_shared_dir(c.shared_dir, cfg.trainer.run_id, c.actor_start_timeout_s)
    elif not cfg.lora.enabled and alive_nodes() > 1:
        raise ConfigError("cluster.shared_dir: full-weight training (lora.enabled: false) on several nodes "
                          "writes checkpoints from the learner nodes; set cluster.shared_dir to a directory "
                          "every node mounts (and output_dir inside it)")
