import pytest
import torch

from grpo_dist.algo import entropy_from_logits, selective_log_softmax


def naive(logits, index):
    return torch.log_softmax(logits.float(), -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)


def naive_entropy(logits):
    lp = torch.log_softmax(logits.float(), -1)
    return -(lp.exp() * lp).sum(-1)


def make(b=3, t=7, v=53, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g) * scale).to(dtype)
    index = torch.randint(0, v, (b, t), generator=g)
    return logits, index


@pytest.mark.parametrize("chunk_size", [None, 1, 4, 100])
def test_matches_naive_fp32(chunk_size):
    logits, index = make()
    out = selective_log_softmax(logits, index, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and out.shape == (3, 7)
    torch.testing.assert_close(out, naive(logits, index), atol=1e-5, rtol=0)


def test_non_contiguous_logits_slice():
    logits, index = make(t=8)
    sliced = logits[:, :-1]  # the usual "drop last position" slice: not viewable as [-1, V]
    assert not sliced.is_contiguous()
    out = selective_log_softmax(sliced, index[:, 1:], chunk_size=3)
    torch.testing.assert_close(out, naive(sliced, index[:, 1:]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_upcast(dtype):
    logits, index = make(dtype=dtype)
    out = selective_log_softmax(logits, index, chunk_size=5)
    assert out.dtype == torch.float32
    # Same fp32 math on the same (already rounded) values as the naive upcast: only summation
    # order differs, so the fp32 tolerance applies.
    torch.testing.assert_close(out, naive(logits, index), atol=1e-5, rtol=0)
    # Against the original fp32 logits the gap is bf16 rounding of the inputs
    # (relative 2^-8 on |logit| <= ~12 -> a few 1e-2 at most).
    ref32, _ = make(dtype=torch.float32)
    assert (out - naive(ref32, index)).abs().max() < 0.1


def test_gradient_matches_naive_fp32():
    logits, index = make()
    g = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))
    a = logits.clone().requires_grad_(True)
    selective_log_softmax(a, index, chunk_size=2).backward(g)
    b = logits.clone().requires_grad_(True)
    naive(b, index).backward(g)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


def test_gradient_matches_naive_bf16_and_noncontiguous():
    logits, index = make(t=8, dtype=torch.bfloat16)
    g = torch.randn(3, 7, generator=torch.Generator().manual_seed(2))
    a = logits.clone().requires_grad_(True)
    selective_log_softmax(a[:, :-1], index[:, 1:], chunk_size=3).backward(g)
    b = logits.clone().requires_grad_(True)
    naive(b[:, :-1], index[:, 1:]).backward(g)
    assert a.grad.dtype == torch.bfloat16
    # both computed in fp32 then rounded to bf16 once: at most one bf16 ulp apart (|grad| < 4)
    torch.testing.assert_close(a.grad.float(), b.grad.float(), atol=2e-2, rtol=0)
    assert a.grad[:, -1].abs().max() == 0


def test_gradcheck_float64():
    # tiny on purpose: each CPU softmax call can cost ~15 ms on an oversubscribed OpenMP pool
    logits, index = make(b=1, t=2, v=4, dtype=torch.float64)
    logits.requires_grad_(True)
    assert selective_log_softmax(logits, index).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda x: selective_log_softmax(x, index, chunk_size=1), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size=1), (logits,))


def test_no_grad_path_and_index_dtype():
    logits, index = make()
    with torch.no_grad():
        out = selective_log_softmax(logits, index.int())
    torch.testing.assert_close(out, naive(logits, index), atol=1e-5, rtol=0)


def test_shape_errors():
    logits, index = make()
    with pytest.raises(ValueError, match="index shape"):
        selective_log_softmax(logits, index[:, :-1])
    with pytest.raises(ValueError, match="chunk_size"):
        selective_log_softmax(logits, index, chunk_size=0)
    with pytest.raises(ValueError):
        selective_log_softmax(torch.randn(5), torch.zeros((), dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_matches_naive(dtype):
    logits, _ = make(dtype=dtype)
    ent = entropy_from_logits(logits, chunk_size=4)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent, naive_entropy(logits), atol=1e-5, rtol=1e-5)
    # uniform logits -> log V
    flat = entropy_from_logits(torch.zeros(2, 3, 53))
    torch.testing.assert_close(flat, torch.full((2, 3), float(torch.log(torch.tensor(53.0)))))


def test_entropy_gradient_and_masked_vocab():
    logits, _ = make()
    g = torch.randn(3, 7, generator=torch.Generator().manual_seed(3))
    a = logits.clone().requires_grad_(True)
    entropy_from_logits(a, chunk_size=3).backward(g)
    b = logits.clone().requires_grad_(True)
    naive_entropy(b).backward(g)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)
    # -inf logits (masked vocabulary) contribute 0 * log 0 = 0, not NaN
    masked = logits.clone()
    masked[..., :10] = float("-inf")
    ent = entropy_from_logits(masked)
    assert torch.isfinite(ent).all()
    torch.testing.assert_close(ent, naive_entropy(logits[..., 10:]), atol=1e-5, rtol=1e-5)
