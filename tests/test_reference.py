"""The periodic reference refresh (``algo.ref_refresh_every`` / ``ref_refresh_mix``) on a real
DeepSpeed + PEFT learner (tiny model, CPU, one process).

The LoRA reference is checked against an independent construction: the base model's weights with
the adapter deltas merged in densely, ``W0 + sum_k c_k * s * B_k @ A_k``, run through plain
transformers.
"""

from __future__ import annotations

import pytest
import torch

from grpo_dist.testing.learner import make_learner, random_batch, randomize_lora, reference_logprobs, small_config

pytestmark = pytest.mark.usefixtures("in_process_learners")
SCALING = 16 / 8  # small_config's LoRA: alpha 16, r 8


def cfg_for(model_dir, **algo):
    return small_config(model_dir, algo=dict(beta=0.04, ref_refresh_every=1, **algo))


def dense_logprobs(model_dir, batch, blocks=()):
    """Per-token log-probs of ``W0 + sum_k c_k * dW_k`` (``blocks``: ``[(c_k, PEFT state dict)]``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    with torch.no_grad():
        for c, tensors in blocks:
            for key, A in tensors.items():
                if not key.endswith(".lora_A.weight"):
                    continue
                name = key[: -len(".lora_A.weight")]
                B = tensors[name + ".lora_B.weight"]
                layer = model.get_submodule(name.removeprefix("base_model.model."))
                layer.weight += c * SCALING * (B.double() @ A.double())
    out = []
    for p, comp in zip(batch.prompt_ids, batch.completion_ids):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + comp])).logits[0]
        lp = torch.log_softmax(logits, -1)[len(p) - 1:len(p) - 1 + len(comp)].gather(-1, torch.tensor(comp)[:, None])
        out.append(lp.squeeze(-1))
    return out


def max_diff(a, b) -> float:
    return max(float((torch.as_tensor(x, dtype=torch.float64) - torch.as_tensor(y, dtype=torch.float64)).abs().max())
               for x, y in zip(a, b))


def test_full_mix_makes_the_reference_the_policy_and_leaves_the_policy_alone(tiny_model_dir):
    learner, _ = make_learner(cfg_for(tiny_model_dir))
    randomize_lora(learner, seed=5, std=0.1)
    batch = random_batch(8, seed=21)
    policy = learner.compute_logprobs(batch)
    ref0 = reference_logprobs(learner, batch)
    assert max_diff(ref0, dense_logprobs(tiny_model_dir, batch)) < 1e-5  # before: the base model
    assert max_diff(ref0, policy) > 1e-2

    info = learner.refresh_reference(1.0)
    assert info["train/ref_refreshes"] == 1 and info["train/ref_rank"] == 8
    assert learner.compute_logprobs(batch) == policy  # the policy (and so the rollouts) unchanged
    ref1 = reference_logprobs(learner, batch)
    assert max_diff(ref1, policy) < 1e-5

    m = learner.train_step(batch)  # the first forward of this step sees policy == reference
    assert m["train/kl"] == pytest.approx(0.0, abs=1e-9) and m["train/ref_refreshes"] == 1
    assert reference_logprobs(learner, batch) == ref1  # training moves the policy, not the reference
    assert max_diff(learner.compute_logprobs(batch), policy) > 1e-4


def test_soft_refresh_is_a_weight_space_mix_and_survives_checkpoints(tiny_model_dir, tmp_path):
    """Two refreshes with mix 0.5 around two updates: ref = W0 + 0.25 dW1 + 0.5 dW2, exactly the
    dense merge; a checkpoint restores it; a mix of 1 then drops the older snapshots."""
    cfg = cfg_for(tiny_model_dir, ref_refresh_mix=0.5)
    learner, _ = make_learner(cfg)
    randomize_lora(learner, seed=6, std=0.1)
    batch = random_batch(8, seed=22)
    snap1 = learner.export_update().tensors
    learner.refresh_reference()  # the configured mix, 0.5
    for _ in range(2):
        learner.train_step(random_batch(8, seed=23))
    snap2 = learner.export_update().tensors
    assert any(not torch.equal(snap1[k], snap2[k]) for k in snap1)
    info = learner.refresh_reference()
    assert info["train/ref_refreshes"] == 2 and info["train/ref_rank"] == 16

    ref = reference_logprobs(learner, batch)
    expected = dense_logprobs(tiny_model_dir, batch, [(0.25, snap1), (0.5, snap2)])
    assert max_diff(ref, expected) < 1e-5
    # the wrong mixes are measurably different from it (the check above can fail)
    assert max_diff(ref, dense_logprobs(tiny_model_dir, batch, [(0.5, snap2)])) > 1e-3
    assert max_diff(ref, dense_logprobs(tiny_model_dir, batch, [(0.5, snap1), (0.5, snap2)])) > 1e-3

    learner.save_checkpoint(tmp_path / "ckpt")
    other, _ = make_learner(cfg)
    other.load_checkpoint(tmp_path / "ckpt")
    assert reference_logprobs(other, batch) == ref
    assert other.reference.refreshes == 2

    learner.refresh_reference(1.0)
    assert learner.reference.rank == 8  # older snapshots weigh 0 now and are dropped
    assert max_diff(reference_logprobs(learner, batch), learner.compute_logprobs(batch)) < 1e-5


def test_checkpoint_from_before_any_refresh_restores_the_base_reference(tiny_model_dir, tmp_path):
    learner, _ = make_learner(cfg_for(tiny_model_dir))
    randomize_lora(learner, seed=7, std=0.1)
    batch = random_batch(8, seed=24)
    base_ref = reference_logprobs(learner, batch)
    learner.save_checkpoint(tmp_path / "early")
    learner.refresh_reference(1.0)
    assert max_diff(reference_logprobs(learner, batch), base_ref) > 1e-2
    learner.load_checkpoint(tmp_path / "early")
    assert learner.reference.refreshes == 0 and reference_logprobs(learner, batch) == base_ref


def test_full_finetuning_reference_mixes_parameters(tiny_model_dir, tmp_path):
    cfg = small_config(tiny_model_dir, lora=dict(enabled=False), learner=dict(lr=1e-3),
                       algo=dict(beta=0.04, ref_refresh_every=1, ref_refresh_mix=0.5))
    learner, _ = make_learner(cfg)
    initial = {k: v.clone() for k, v in learner.reference.model.state_dict().items()}
    learner.train_step(random_batch(8, seed=25))
    policy = {k: v.detach().clone() for k, v in learner.engine.module.state_dict().items()}
    learner.refresh_reference()
    moved = 0
    for k, v in learner.reference.model.state_dict().items():
        torch.testing.assert_close(v, 0.5 * initial[k] + 0.5 * policy[k], rtol=0, atol=1e-7)
        moved += int(not torch.equal(initial[k], policy[k]))
    assert moved > 0

    batch = random_batch(8, seed=26)
    learner.save_checkpoint(tmp_path / "ckpt")
    other, _ = make_learner(cfg)
    other.load_checkpoint(tmp_path / "ckpt")
    assert reference_logprobs(other, batch) == reference_logprobs(learner, batch)

    learner.refresh_reference(1.0)
    assert max_diff(reference_logprobs(learner, batch), learner.compute_logprobs(batch)) < 1e-6


def test_refresh_rejects_a_mix_outside_0_1(tiny_model_dir):
    learner, _ = make_learner(cfg_for(tiny_model_dir))
    with pytest.raises(ValueError, match="mix must be in"):
        learner.refresh_reference(0.0)
    assert learner.reference.refreshes == 0


def test_refresh_without_a_reference_is_an_error_not_a_silent_no_op(tiny_model_dir):
    learner, _ = make_learner(small_config(tiny_model_dir, lora=dict(enabled=False), algo=dict(beta=0.0)))
    with pytest.raises(RuntimeError, match="no reference to refresh"):
        learner.refresh_reference(1.0)
    assert learner.reference.refreshes == 0
