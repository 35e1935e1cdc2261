"""One learner rank on the GPU, run as a script by ``tests/test_gpu_learner.py`` (a script, not an
import: the test modules are not importable by name in spawned processes).

    python tests/gpu_ranks.py RANK WORLD PORT BACKEND MODEL_DIR OUT_JSON

Every rank sits on ``cuda:0`` (``cluster.learner_gpus: 1``, ``local_rank 0``) and trains two
steps on its shard of one fixed batch with ``top_entropy_frac`` 0.5 (an ``all_gather_object`` and
``all_reduce``s), ZeRO-2, KL reference on; then ``save_checkpoint`` (barriers) and
``export_update``. Writes the metrics (and the exported tensors' sums on rank 0) as JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def batch(n: int, seed: int):
    from grpo_dist.types import TrainBatch

    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(4, 60) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    comps = [[rng.randrange(4, 60) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    return TrainBatch(prompt_ids=prompts, completion_ids=comps, behaviour_logprobs=[],
                      advantages=[rng.gauss(0.0, 1.0) for _ in range(n)])


def main(rank: int, world: int, port: int, backend: str, model_dir: str, out: str) -> None:
    from grpo_dist.util.procenv import setup_env

    setup_env()
    import torch

    from grpo_dist.config import config_from_dict
    from grpo_dist.learner import Learner

    cfg = config_from_dict(dict(
        model={"path": model_dir, "dtype": "float32"},
        lora={"dropout": 0.0},
        rollout={"prompts_per_step": 2, "group_size": 4, "max_tokens": 8},
        learner={"micro_batch_size": 2, "lr": 2e-3, "num_learners": world, "zero_stage": 2, "comm_backend": backend},
        algo={"beta": 0.04, "top_entropy_frac": 0.5},
        cluster={"learner_gpus": 0 if os.environ.get("GPU_RANKS_ON_CPU") else 1},  # CPU: a dry run of this script
        trainer={"steps": 10},
    ))
    learner = Learner(cfg, rank=rank, world_size=world, master_port=port, local_rank=0)
    learner.setup()
    res = {"rank": rank, "world": world, "backend": torch.distributed.get_backend(),
           "device": str(learner.device), "steps": []}
    for seed in (0, 1):
        res["steps"].append(learner.train_step(batch(8, seed).shard(rank, world)))
    learner.save_checkpoint(os.path.join(os.path.dirname(out), f"ckpt_w{world}_{backend}"))
    update = learner.export_update()
    if update is not None:
        res["export_sums"] = {k: float(v.double().sum()) for k, v in update.tensors.items()}
    learner.shutdown()
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), a[3], a[4], a[5])
