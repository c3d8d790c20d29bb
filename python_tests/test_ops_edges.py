"""Edges of the ops' Python layer (galerkin_ext.ops, galerkin_ext.domain) that the op tests
did not pin, each found by a mutation round: the Fourier type's dropout under forward-mode AD
(the formula path must still drop entries of the N × M matrix), the fused CPU path's dtype for
half inputs, continuum attention's zero for a sample without keys while tracing, the fused
softmax backward's weight gradient with a scale, kv_reduce's fake dtype, the compiled core on
float64, and two checks of domain.py (reference dropout refused, DomainSplit.even's counts).
Values are checked in float64 against galerkin_ext.reference or formulas written out here."""


import pytest
import torch
from torch.autograd import forward_ad

from galerkin_ext import ops, reference

F64 = torch.float64


def _fourier_reference(q, k, v, mask):
    """reference.fourier_attention in float64 (uniform weights, no norms or coordinates),
    with ``mask`` on its N × M matrix."""
    q, k, v, mask = (t.to(F64) for t in (q, k, v, mask))
    return reference.fourier_attention(q, k, v, dropout_mask=mask)


def test_fourier_dropout_under_forward_mode_ad_drops_the_n_by_m_matrix(gen):
    """Under forward-mode AD the formula runs (the fused op has no forward derivative); its
    dropout must still act on the N × M matrix, with torch's mask, not on the factored d × d
    product."""
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=F64)
    k, v = (torch.randn(1, 2, 4, 3, generator=gen, dtype=F64) for _ in range(2))
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(q, torch.zeros_like(q))
        torch.manual_seed(7)
        got = forward_ad.unpack_dual(ops.fourier_attention(dual, k, v, dropout_p=0.5)).primal
    torch.manual_seed(7)
    mask = torch.nn.functional.dropout(torch.ones(1, 2, 5, 4, dtype=F64), 0.5)
    torch.testing.assert_close(got, _fourier_reference(q, k, v, mask), rtol=1e-12, atol=1e-12)


def test_fused_fourier_dropout_returns_the_dtype_of_half_inputs(gen):
    """The fused CPU op computes in float32; a bfloat16 input gets a bfloat16 output, as
    without dropout, with the values of the float32 computation (ops.dropout's mask over the
    contiguous N × M matrix)."""
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen).to(torch.bfloat16) for _ in range(3))
    torch.manual_seed(5)
    got = ops.fourier_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(5)
    mask = ops.dropout(torch.ones(2, 2, 6, 6), 0.3)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.to(F64), _fourier_reference(q, k, v, mask), rtol=1e-2,
                               atol=1e-2)


def test_continuum_attention_gives_zero_to_a_sample_without_keys_while_tracing(gen,
                                                                               monkeypatch):
    """Tracing skips the check that refuses a sample whose weights are all 0; that sample then
    gets 0 (its bias is 0, so SDPA alone returns the plain softmax average), the others the
    weighted softmax attention."""
    import galerkin_ext._checks as checks
    monkeypatch.setattr(checks, "is_tracing", lambda t: True)
    q = torch.randn(2, 2, 3, 4, generator=gen, dtype=F64)
    k, v = (torch.randn(2, 2, 5, 4, generator=gen, dtype=F64) for _ in range(2))
    weight = torch.tensor([[0.0] * 5, [0.1, 0.0, 0.3, 0.2, 0.4]], dtype=F64)
    got = ops.continuum_attention(q, k, v, weight=weight)
    logits = q[1] @ k[1].transpose(-2, -1) / 2.0  # 1 / sqrt(D)
    probs = weight[1] * logits.exp()
    expected = (probs / probs.sum(-1, keepdim=True)) @ v[1]
    torch.testing.assert_close(got[0], torch.zeros_like(got[0]), rtol=0, atol=0)
    torch.testing.assert_close(got[1], expected, rtol=1e-12, atol=1e-12)


def test_fused_softmax_dropout_weight_gradient_under_create_graph_with_a_scale(gen):
    """create_graph=True takes the fused softmax op's gradients from its Python formula; the
    logits' bias (log w) enters unscaled, so its gradient carries no factor ``scale`` (every
    other test of it ran with scale 1 or without weights)."""
    q = torch.randn(2, 2, 4, 3, generator=gen, dtype=F64)
    k, v = (torch.randn(2, 2, 6, 3, generator=gen, dtype=F64) for _ in range(2))
    weight = (torch.rand(2, 6, generator=gen, dtype=F64) + 0.1).requires_grad_()
    torch.manual_seed(11)
    out = ops.continuum_attention(q, k, v, weight=weight, scale=0.37, dropout_p=0.4)
    (got,) = torch.autograd.grad((out * v[:, :, :4]).sum(), weight, create_graph=True)
    torch.manual_seed(11)
    mask = ops.dropout(torch.ones(2, 2, 4, 6, dtype=F64), 0.4)
    w = weight.detach().clone().requires_grad_()
    logits = 0.37 * (q @ k.transpose(-2, -1)) + w.log()[:, None, None, :]
    expected_out = (logits.softmax(dim=-1) * mask) @ v
    (expected,) = torch.autograd.grad((expected_out * v[:, :, :4]).sum(), w)
    torch.testing.assert_close(out, expected_out.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_kv_reduce_fake_accumulates_half_inputs_in_float32():
    """The compiled kv_reduce returns S in float32 for half inputs (the CUDA kernels take
    them; the CPU ones do not, so only the fake shows it here): its fake must say so, and the
    width ``P + D_v + 1`` with the ones column, or a compiled graph gets S's dtype wrong."""
    k = torch.empty(2, 3, 5, 4, device="meta", dtype=torch.float16)
    v = torch.empty(2, 3, 5, 6, device="meta", dtype=torch.float16)
    kv_pos = torch.empty(5, 2, device="meta", dtype=torch.float16)
    s = torch.ops.galerkin_ext.kv_reduce(k, v, kv_pos, None, "softmax", None, None, "identity",
                                         None, None, 0.0, True)
    assert (s.shape, s.dtype) == ((2, 3, 2 + 4, 2 + 6 + 1), torch.float32)


def test_float64_runs_the_compiled_core_on_the_cpu(gen):
    """CPU float64 tensors take the compiled kv_reduce and q_apply (not the plain formulas,
    which give the same values at several times the cost): the ops a dispatch mode sees, and
    the value against reference.galerkin_attention ``Q (Kᵀ V) / M``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    q, k, v = (torch.randn(1, 2, 5, 3, generator=gen, dtype=F64) for _ in range(3))
    with Seen() as seen:
        got = ops.galerkin_attention(q, k, v)
    assert {"galerkin_ext.kv_reduce", "galerkin_ext.q_apply"} <= seen.ops
    torch.testing.assert_close(got, reference.galerkin_attention(q, k, v), rtol=1e-12,
                               atol=1e-12)


def test_make_domain_parallel_refuses_fourier_attention_with_reference_dropout():
    """reference_dropout drops the N × N matrix on every forward whatever attn_dropout says;
    no rank holds that matrix, so it is refused like attn_dropout > 0."""
    from galerkin_ext.domain import make_domain_parallel
    from galerkin_ext.layers import SimpleAttention

    with pytest.raises(ValueError, match="reference_dropout"):
        make_domain_parallel(SimpleAttention(8, 2, "fourier", reference_dropout=True))
    make_domain_parallel(SimpleAttention(8, 2, "galerkin", reference_dropout=True))


def test_even_split_gives_the_extra_points_to_the_first_ranks(monkeypatch):
    """DomainSplit.even(8) over 3 ranks holds 3, 3, 2 points (the first n mod world_size ranks
    one more); the group is faked (no processes started): rank 2 of 3, and an all-gather that
    finds every rank's counts equal to this one's."""
    from galerkin_ext import domain

    def gather(every, obj, group=None):
        every[:] = [obj] * len(every)

    monkeypatch.setattr(domain, "_world", lambda group: "group")
    monkeypatch.setattr(domain.dist, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(domain.dist, "get_rank", lambda group=None: 2)
    monkeypatch.setattr(domain.dist, "all_gather_object", gather)
    split = domain.DomainSplit.even(8)
    assert (split.counts, split.start, split.stop, split.local_n) == ((3, 3, 2), 6, 8, 2)


def test_a_sample_without_keys_on_any_rank_gets_zero(gen, monkeypatch):
    """Shards may be empty, and a sample may have no key on any rank: its partial sums are 0,
    and so is its output, as for a sample whose weights are all 0 (dividing by the key count 0
    gave NaN). The group is faked: two ranks whose shards are both empty."""
    from galerkin_ext import domain

    monkeypatch.setattr(domain, "_split_group", lambda group: "group")
    monkeypatch.setattr(domain, "_group_sum", lambda s, extra, group: (s, extra))
    monkeypatch.setattr(domain.dist, "get_world_size", lambda group=None: 2)
    q = torch.randn(2, 2, 5, 3, generator=gen, dtype=F64)
    none = torch.zeros(2, 2, 0, 3, dtype=F64)
    for attention in (domain.galerkin_attention, domain.fourier_attention):
        out = attention(q, none, none)
        assert out.shape == (2, 2, 5, 3) and not out.any(), attention.__name__
