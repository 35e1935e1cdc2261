"""Memory-efficient per-token log-probabilities and entropies from logits.

The naive ``torch.log_softmax(logits.float(), -1).gather(-1, idx)`` materialises a full
``[B, T, V]`` float32 tensor (2.5 GB for 4 x 1024 tokens over a 151936-word vocabulary, plus
another 2.5 GB for the upcast when the logits are bf16). The functions here walk over the
``B*T`` rows in chunks of a few hundred rows, upcast one chunk at a time to float32, and keep
only ``[B, T]`` results, so the extra memory is a couple of chunk-sized buffers.

Both are ``torch.autograd.Function``s: the forward saves only the input logits (a reference,
no copy) and the small ``[B, T]`` result, and the backward recomputes the chunk's softmax, so
no ``B*T*V`` float32 tensor is kept for autograd either. The gradient itself has the shape and
dtype of the logits, exactly as the naive version's.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

__all__ = ["selective_log_softmax", "entropy_from_logits", "DEFAULT_CHUNK_ELEMENTS"]

#: Target number of logits per chunk (rows = max(1, DEFAULT_CHUNK_ELEMENTS // V)); 32M float32
#: values = 128 MB, i.e. 220 rows of a 151936-word vocabulary. Tuned with benchmarks/logprobs.py.
DEFAULT_CHUNK_ELEMENTS = 32 * 2**20


def _chunk_rows(vocab: int, chunk_size: Optional[int]) -> int:
    if chunk_size is not None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1 row, got {chunk_size}")
        return int(chunk_size)
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(1, vocab))


def _iter_chunks(
    logits: torch.Tensor, rows: int
) -> Iterator[Tuple[tuple, torch.Tensor]]:
    """Yield ``(key, chunk[n, V])`` where ``key`` indexes the ``[..., V]``-stripped output.

    Uses a flat ``[-1, V]`` view when the leading dims can be flattened without a copy
    (contiguous logits); otherwise (e.g. ``logits[:, :-1]`` slices) walks each leading row of a
    3-D tensor so that every chunk is still a view.
    """
    vocab = logits.shape[-1]
    lead = logits.shape[:-1]
    try:
        flat = logits.view(-1, vocab)
        n = flat.shape[0]
        for start in range(0, n, rows):
            end = min(start + rows, n)
            yield (None, slice(start, end)), flat[start:end]
        return
    except RuntimeError:
        pass
    if logits.dim() == 3:
        for b in range(lead[0]):
            row = logits[b]
            for start in range(0, lead[1], rows):
                end = min(start + rows, lead[1])
                yield (b, slice(start, end)), row[start:end]
        return
    # Exotic layout with > 3 dims: fall back to one copy in the logits' own dtype.
    yield from _iter_chunks(logits.contiguous(), rows)


def _out_view(out: torch.Tensor, key: tuple) -> torch.Tensor:
    b, sl = key
    if b is None:
        return out.view(-1)[sl]
    return out[b, sl]


def _grad_view(grad: torch.Tensor, key: tuple) -> torch.Tensor:
    b, sl = key
    if b is None:
        return grad.view(-1, grad.shape[-1])[sl]
    return grad[b, sl]


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() < 2:
        raise ValueError(f"logits must have shape [..., V] with at least 2 dims, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor, got {logits.dtype}")


def _out_dtype(logits: torch.Tensor) -> torch.dtype:
    # float64 stays float64 (gradcheck); every lower precision is computed and returned in float32.
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


class _Workspace:
    """Two chunk-sized buffers reused across chunks (an upcast copy and a result).

    Reusing them instead of allocating per chunk avoids re-faulting fresh pages for every
    chunk, which on CPU costs about as much as the softmax itself.
    """

    def __init__(self, logits: torch.Tensor, rows: int):
        self.cdt = _out_dtype(logits)
        n = min(rows, max(1, logits[..., 0].numel()))
        shape = (n, logits.shape[-1])
        self.upcast = None if logits.dtype == self.cdt else torch.empty(shape, dtype=self.cdt, device=logits.device)
        self.result = torch.empty(shape, dtype=self.cdt, device=logits.device)

    def inputs(self, chunk: torch.Tensor) -> torch.Tensor:
        """The chunk in the compute dtype (a view when no upcast is needed)."""
        if self.upcast is None:
            return chunk
        buf = self.upcast[: chunk.shape[0]]
        buf.copy_(chunk)
        return buf

    def log_softmax(self, chunk: torch.Tensor) -> torch.Tensor:
        out = self.result[: chunk.shape[0]]
        torch.log_softmax(self.inputs(chunk), -1, out=out)
        return out

    def softmax(self, chunk: torch.Tensor) -> torch.Tensor:
        out = self.result[: chunk.shape[0]]
        torch.softmax(self.inputs(chunk), -1, out=out)
        return out


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
        ws = _Workspace(logits, rows)
        out = torch.empty(logits.shape[:-1], dtype=ws.cdt, device=logits.device)
        for key, chunk in _iter_chunks(logits, rows):
            idx = _out_view(index, key)
            lsm = ws.log_softmax(chunk)
            torch.gather(lsm, -1, idx.unsqueeze(-1), out=_out_view(out, key).unsqueeze(-1))
        del ws
        ctx.save_for_backward(logits, index)
        ctx.rows = rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, index = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        ws = _Workspace(logits, ctx.rows)
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        for key, chunk in _iter_chunks(logits, ctx.rows):
            g = _out_view(grad_out, key).to(ws.cdt).unsqueeze(-1)
            idx = _out_view(index, key).unsqueeze(-1)
            # d logp[idx] / d x_j = 1[j == idx] - softmax_j
            p = ws.softmax(chunk)
            p.mul_(-g)
            p.scatter_add_(-1, idx, g)
            _grad_view(grad, key).copy_(p)
        return grad, None, None


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, rows: int) -> torch.Tensor:
        ws = _Workspace(logits, rows)
        out = torch.empty(logits.shape[:-1], dtype=ws.cdt, device=logits.device)
        for key, chunk in _iter_chunks(logits, rows):
            lsm = ws.log_softmax(chunk)
            p = lsm.exp()
            # H = -sum p log p, with 0 * log 0 := 0 for -inf logits (masked vocabulary entries)
            ent = p.mul_(lsm.nan_to_num_(neginf=0.0)).sum(-1).neg_()
            _out_view(out, key).copy_(ent)
            del p
        del ws
        ctx.save_for_backward(logits, out)
        ctx.rows = rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, ent = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        ws = _Workspace(logits, ctx.rows)
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        for key, chunk in _iter_chunks(logits, ctx.rows):
            g = _out_view(grad_out, key).to(ws.cdt).unsqueeze(-1)
            h = _out_view(ent, key).unsqueeze(-1)
            # dH/dx_j = -p_j (log p_j + H)
            lsm = ws.log_softmax(chunk)
            p = lsm.exp()
            lsm.nan_to_num_(neginf=0.0).add_(h).mul_(p).mul_(-g)
            _grad_view(grad, key).copy_(lsm)
            del p
        return grad, None


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, *, chunk_size: Optional[int] = None
) -> torch.Tensor:
    """Log-probability of the chosen token at every position, computed chunk by chunk.

    Args:
        logits: ``[B, T, V]`` (any leading shape ``[..., V]``), float32 / bf16 / fp16 / float64.
        index: ``[B, T]`` integer token ids (same leading shape as ``logits``), values in ``[0, V)``.
        chunk_size: rows of ``V`` logits processed at once; default
            ``max(1, DEFAULT_CHUNK_ELEMENTS // V)``.

    Returns:
        ``[B, T]`` float32 (float64 if the logits are float64) tensor equal to
        ``log_softmax(logits.float(), -1).gather(-1, index[..., None]).squeeze(-1)``.
        Differentiable w.r.t. ``logits``; never holds more than one chunk in float32.
    """
    _check_logits(logits)
    if tuple(index.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"index shape {tuple(index.shape)} must equal logits.shape[:-1] = {tuple(logits.shape[:-1])}"
        )
    index = index.long().contiguous()
    rows = _chunk_rows(logits.shape[-1], chunk_size)
    return _SelectiveLogSoftmax.apply(logits, index, rows)


def entropy_from_logits(logits: torch.Tensor, *, chunk_size: Optional[int] = None) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` of the softmax at every position, chunk by chunk.

    Args:
        logits: ``[B, T, V]`` (any leading shape ``[..., V]``).
        chunk_size: rows per chunk, as in :func:`selective_log_softmax`.

    Returns:
        ``[B, T]`` float32 (float64 for float64 logits), differentiable w.r.t. ``logits``.
    """
    _check_logits(logits)
    rows = _chunk_rows(logits.shape[-1], chunk_size)
    return _Entropy.apply(logits, rows)
