"""The KL reference of one learner rank, and its periodic refresh.

``algo.ref_refresh_every: k`` mixes the current policy into the reference every k trainer steps
with weight ``algo.ref_refresh_mix`` (TRL's ``sync_ref_model`` / TR-DPO's soft update
``ref <- mix * policy + (1 - mix) * ref``). The reference only lives on the learner, so a refresh
moves no weights to the rollout workers and the trained artifact stays a plain adapter on the
original base model.

* **LoRA.** The policy is ``W0 + dW`` with ``dW = s * B @ A`` per adapted layer and the initial
  reference is ``W0`` (adapter disabled). A refresh keeps a frozen snapshot of the adapter, and
  the reference becomes ``W0 + sum_k c_k dW_k`` -- the mix taken in *weight* space, exactly (a mix
  of the A and B factors themselves would add cross terms). The reference forward runs with the
  adapter disabled and a forward hook on every adapted base layer adding
  ``sum_k c_k s_k B_k (A_k x)`` (snapshots concatenated along the rank). After ``n`` refreshes the
  oldest snapshot weighs ``(1 - mix)^(n-1)``; snapshots whose weight falls below
  ``DROP_BELOW`` are dropped, which bounds the rank (mix 0.6: at most 16 snapshots) at a
  reference error under 1e-6 of one adapter's delta. ``mix = 1`` keeps exactly one snapshot.
* **Full fine-tuning.** A frozen copy of the model (made at set-up when the KL needs it), mixed in
  parameter space: ``ref.lerp_(policy, mix)``.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Callable, Iterator

import torch

DROP_BELOW = 1e-6
FILE = "reference.pt"


class Reference:
    def __init__(self, module: torch.nn.Module, lora: bool, needs_copy: bool, device: torch.device):
        """``module``: the policy (PEFT model for LoRA), before DeepSpeed wraps it."""
        self.lora = lora
        self.refreshes = 0
        # LoRA: [(weight c_k, {layer name: (A [r, in], B * scaling [out, r])})], oldest first
        self.blocks: list[tuple[float, dict[str, tuple[torch.Tensor, torch.Tensor]]]] = []
        self._cat: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.model = None
        if not lora and needs_copy:
            self.model = copy.deepcopy(module).to(device).eval().requires_grad_(False)

    # ---------------------------------------------------------------- forward
    @contextlib.contextmanager
    def active(self, module: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """Context in which calling the yielded module gives the reference's outputs (no grad)."""
        if self.model is not None:
            yield self.model
            return
        if not self.lora:
            raise RuntimeError("full fine-tuning keeps a reference copy only when algo.beta > 0")
        with module.disable_adapter(), self._hooks(module):
            yield module

    @contextlib.contextmanager
    def _hooks(self, module: torch.nn.Module) -> Iterator[None]:
        handles = []
        try:
            if self._cat:
                for name, layer in _lora_layers(module):
                    if name in self._cat:
                        A, B = self._cat[name]
                        handles.append(layer.base_layer.register_forward_hook(_add_delta(A, B)))
            yield
        finally:
            for h in handles:
                h.remove()

    # ---------------------------------------------------------------- refresh
    @torch.no_grad()
    def refresh(self, module: torch.nn.Module, mix: float,
                gathered: Callable[[list], contextlib.AbstractContextManager]) -> None:
        """``ref <- mix * policy + (1 - mix) * ref``. ``gathered(params)``: a context that makes
        ZeRO-3 partitioned parameters whole (a no-op below stage 3)."""
        if not 0.0 < mix <= 1.0:
            raise ValueError(f"mix must be in (0, 1], got {mix}")
        if self.model is not None:
            params = list(module.parameters())
            with gathered(params):
                for r, p in zip(self.model.parameters(), params):
                    r.lerp_(p.detach().to(r.dtype), mix)
        elif self.lora:
            layers = _lora_layers(module)
            params = [p for _, layer in layers
                      for p in (layer.lora_A["default"].weight, layer.lora_B["default"].weight)]
            with gathered(params):
                snap = {name: (layer.lora_A["default"].weight.detach().clone(),
                               (layer.lora_B["default"].weight.detach() * layer.scaling["default"]).clone())
                        for name, layer in layers}
            self.blocks = [(c * (1.0 - mix), b) for c, b in self.blocks if c * (1.0 - mix) >= DROP_BELOW]
            self.blocks.append((mix, snap))
            self._rebuild()
        else:
            raise RuntimeError("no reference to refresh: full fine-tuning keeps a reference copy only when "
                               "algo.beta > 0")
        self.refreshes += 1

    def _rebuild(self) -> None:
        self._cat = {}
        if not self.blocks:
            return
        for name in self.blocks[-1][1]:
            As = [b[name][0] for _, b in self.blocks]
            Bs = [b[name][1] * c for c, b in self.blocks]
            self._cat[name] = (torch.cat(As, dim=0), torch.cat(Bs, dim=1))

    @property
    def rank(self) -> int:
        """Total rank of the reference's delta (0 = the base model)."""
        return sum(next(iter(b.values()))[0].shape[0] for _, b in self.blocks) if self.blocks else 0

    # ---------------------------------------------------------------- checkpoints
    def save(self, directory: str | Path) -> None:
        """Written only after a refresh (before one, the reference is the base model / set-up copy)."""
        if not self.refreshes:
            return
        state: dict = {"refreshes": self.refreshes}
        if self.model is not None:
            state["model"] = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        else:
            state["blocks"] = [(c, {k: (a.cpu(), b.cpu()) for k, (a, b) in blk.items()}) for c, blk in self.blocks]
        torch.save(state, Path(directory) / FILE)

    def load(self, directory: str | Path, device: torch.device) -> None:
        path = Path(directory) / FILE
        if not path.is_file():  # checkpoint taken before any refresh: the reference is the base
            self.refreshes, self.blocks, self._cat = 0, [], {}
            return
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.refreshes = int(state["refreshes"])
        if "model" in state:
            if self.model is None:
                raise RuntimeError(f"{path} holds a full reference model but this learner keeps none")
            self.model.load_state_dict(state["model"])
        else:
            self.blocks = [(float(c), {k: (a.to(device), b.to(device)) for k, (a, b) in blk.items()})
                           for c, blk in state["blocks"]]
            self._rebuild()


def _lora_layers(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from peft.tuners.lora import LoraLayer

    out = [(name, m) for name, m in module.named_modules()
           if isinstance(m, LoraLayer) and "default" in getattr(m, "lora_A", {})]
    for name, m in out:
        if not isinstance(m.lora_A["default"], torch.nn.Linear) or getattr(m, "lora_variant", {}).get("default"):
            raise NotImplementedError(f"reference refresh supports plain LoRA on linear layers only ({name})")
    return out


def _add_delta(A: torch.Tensor, B: torch.Tensor):
    def hook(_module, inputs, output):
        x = inputs[0].to(A.dtype)
        return output + (x @ A.t() @ B.t()).to(output.dtype)
    return hook
