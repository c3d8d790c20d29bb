"""galerkin_ext.complexity: parameter counts, and FLOP counts against closed forms written here
(the paper's convention: 2mnk a product, 5 r log2 r a complex FFT of length r), for the
package's ops forward and backward, the FFTs, the CPU's fused softmax attention and whole
models; the meta device counts what the CPU computes."""

import math

import pytest
import torch

from galerkin_ext import ops
from galerkin_ext.complexity import flop_counter_mode, forward_flops, parameter_count
from galerkin_ext.models import build_model


def counted(fn) -> int:
    with flop_counter_mode() as counter:
        fn()
    return counter.get_total_flops()


def fft_flops(count: int, length: int) -> float:
    return 5 * count * length * math.log2(length)


def test_parameter_count():
    model = build_model("vitno")
    assert parameter_count(model) == 716_417  # SPEC-continuum §2; complex entries count once
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        parameter_count([torch.zeros(3)])


@pytest.mark.parametrize("shape", [(2, 3, 6, 10), (1, 1, 7, 5)])
def test_fft_formulas(shape):
    b, c, s1, s2 = shape
    x = torch.randn(shape)
    half = s2 // 2 + 1
    # rfft2: real transforms along the last axis, then complex ones over the half spectrum
    want = round(fft_flops(b * c * s1, s2) + fft_flops(b * c * half, s1))
    assert counted(lambda: torch.fft.rfft2(x)) == want
    y = torch.fft.rfft2(x)
    assert counted(lambda: torch.fft.irfft2(y, s=(s1, s2))) == want
    assert counted(lambda: torch.fft.rfft(x)) == round(fft_flops(b * c * s1, s2))
    z = torch.randn(b, c, s1, s2, dtype=torch.complex64)
    assert counted(lambda: torch.fft.fft2(z)) == round(fft_flops(b * c * s1, s2)
                                                       + fft_flops(b * c * s2, s1))
    # axes in any order: torch halves the last axis of dim as given (here axis 2, of s1
    # points); sorted, the count had taken axis 3 for it
    want = round(fft_flops(b * c * s2, s1) + fft_flops(b * c * (s1 // 2 + 1), s2))
    assert counted(lambda: torch.fft.rfftn(x, dim=(3, 2))) == want
    y = torch.fft.rfftn(x, dim=(3, 2))
    assert counted(lambda: torch.fft.irfftn(y, s=(s2, s1), dim=(3, 2))) == want
    # an axis of 2 points: 5·2·log2(2) = 10 a transform; of 1 point: none
    assert counted(lambda: torch.fft.fft(z[..., :2, :], dim=2)) == round(fft_flops(b * c * s2, 2))
    assert counted(lambda: torch.fft.fft(z[..., :1, :], dim=2)) == 0
    # the paper's (15/2) N log2 sqrt(N) for an s x s grid, up to its s/2 for the s/2 + 1 columns
    s = 16
    square = counted(lambda: torch.fft.rfft2(torch.randn(s, s)))
    assert square == pytest.approx(7.5 * s * s * math.log2(s), rel=1.5 / s)


@pytest.mark.parametrize("pos_dim", [0, 2])
def test_attention_op_formulas_forward_and_backward(pos_dim, gen):
    b, h, n, m, d = 2, 3, 11, 7, 5
    q = torch.randn(b, h, n, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(b, h, m, d, generator=gen, requires_grad=True) for _ in range(2))
    pos = torch.rand(b, n, pos_dim, generator=gen) if pos_dim else None
    kv_pos = torch.rand(b, m, pos_dim, generator=gen) if pos_dim else None
    w = pos_dim + d
    # Galerkin: S = K̂ᵀ V̂ over the M keys, then Q̂ S over the N queries
    forward = 2 * b * h * (m + n) * w * w

    def galerkin():
        return ops.galerkin_attention(q, k, v, pos=pos, kv_pos=kv_pos)

    assert counted(galerkin) == forward
    assert counted(lambda: galerkin().sum().backward()) == 3 * forward  # two products each way
    # GNOT's normalised attention: V̂ gains the normaliser's column of ones
    normalized = 2 * b * h * (m + n) * w * (w + 1)
    assert counted(lambda: ops.normalized_attention(q, k, v, pos=pos, kv_pos=kv_pos)) == normalized
    assert counted(lambda: ops.hetero_normalized_attention(
        q, [k, k], [v, v], pos=pos, kv_pos=[kv_pos, kv_pos])) == (
        2 * b * h * 2 * m * w * (w + 1) + 2 * b * h * n * w * 2 * (w + 1))


def test_cpu_softmax_attention(gen):
    """PyTorch counts its GPU attention kernels; the CPU's fused one is counted here."""
    b, h, n, m, d = 2, 2, 9, 6, 4
    q = torch.randn(b, h, n, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(b, h, m, d, generator=gen, requires_grad=True) for _ in range(2))
    forward = 4 * b * h * n * m * d  # Q Kᵀ and the weighted sum of V
    assert counted(lambda: ops.continuum_attention(q, k, v)) == forward
    # the backward as PyTorch counts its fused kernels': the scores recomputed, then dV, dP,
    # dQ and dK, five products of the forward's two
    backward = 5 * forward // 2
    assert counted(lambda: ops.continuum_attention(q, k, v).sum().backward()) == (
        forward + backward)


def test_fused_attention_with_dropout(gen):
    """The fused CPU ops that drop the N × M matrix count as SDPA does: the Fourier type's
    quadratic product and softmax attention."""
    b, h, n, m, d = 2, 2, 9, 6, 4
    q = torch.randn(b, h, n, d, generator=gen, requires_grad=True)
    k, v = (torch.randn(b, h, m, d, generator=gen, requires_grad=True) for _ in range(2))
    forward = 4 * b * h * n * m * d
    backward = 5 * forward // 2
    for attention in (lambda: ops.continuum_attention(q, k, v, dropout_p=0.2),
                      lambda: torch.ops.galerkin_ext.quadratic_attention(
                          q, k, v, 0.2, torch.tensor(1))):
        assert counted(attention) == forward
        assert counted(lambda f=attention: f().sum().backward()) == forward + backward


def test_tno_forward_flops_closed_form(gen):
    """TNO: lift, per layer Q, K, V, O projections, softmax attention and the feed-forward
    block, then the projection."""
    d_u, d, d_z, dm, heads, layers, dff, n = 1, 2, 1, 16, 4, 2, 24, 30
    model = build_model("tno_darcy", d_model=dm, n_head=heads, num_layers=layers,
                        dim_feedforward=dff).eval()
    u, x = torch.randn(2, n, d_u, generator=gen), torch.rand(n, d, generator=gen)
    per_layer = 4 * 2 * n * dm * dm + 4 * n * n * dm + 2 * 2 * n * dm * dff
    want = 2 * (2 * n * (d_u + d) * dm + layers * per_layer + 2 * n * dm * d_z)
    assert forward_flops(model, u, x, weight=None) == want


@pytest.mark.parametrize(("name", "shape", "kwargs"), [
    ("burgers", (2, 64, 1), {}),
    ("vitno", (1, 26, 26, 1), {"d_model": 16, "n_head": 2, "num_layers": 1, "lift_modes": 3,
                              "final_modes": 4}),
    ("fno_ca", (1, 16, 16, 1), {"width": 8, "n_modes": 4, "lifting": 8, "projection": 8}),
])
def test_meta_device_counts_what_the_cpu_computes(name, shape, kwargs, gen):
    u = torch.randn(shape, generator=gen)
    grid = (torch.rand(shape[1], 1, generator=gen) if len(shape) == 3
            else torch.rand(shape[1], shape[2], 2, generator=gen))
    torch.manual_seed(0)
    model = build_model(name, **kwargs)
    on_cpu = forward_flops(model, u, grid)
    with torch.device("meta"):
        meta_model = build_model(name, **kwargs)
    on_meta = forward_flops(meta_model, u.to("meta"), grid.to("meta"))
    assert on_cpu == on_meta > 0


def test_counting_holds_spectral_products_to_ffts_only_while_it_counts():
    """The CPU runs spectral products as DFT-matrix products where that is faster; a counter
    counts their FFTs (the convention) in its own thread only, and leaves the choice as it
    was, after an error too, and whatever order two threads' counters close in."""
    import threading

    from torch.utils import _python_dispatch as python_dispatch

    from galerkin_ext.layers import fourier

    x = torch.empty(0)

    def products() -> bool:
        return fourier._matmuls_pay(x, 4, 64)

    assert products()
    with flop_counter_mode():
        assert not products()
        seen = []
        other = threading.Thread(target=lambda: seen.append(products()))
        other.start()
        other.join()
        assert seen == [True]
    with pytest.raises(RuntimeError, match="inside"), flop_counter_mode():
        raise RuntimeError("inside")
    assert products()
    # thread A opens, B opens, A closes, B counts (the order that left a shared flag wrong)
    steps = [threading.Event() for _ in range(3)]
    counted = []

    def thread_a():
        with flop_counter_mode():
            steps[0].set()
            steps[1].wait()
        steps[2].set()

    def thread_b():
        steps[0].wait()
        with flop_counter_mode():
            steps[1].set()
            steps[2].wait()
            counted.append(products())
        counted.append(products())

    # torch keeps "a dispatch mode is active" in process-wide flags that each mode restores on
    # exit: closed out of order across threads, they stay set, and torch 2.5's dynamo then
    # compiles nothing for the rest of the process (GNOT's compile-count tests saw no frame)
    flags = {name: value for name, value in vars(python_dispatch).items()
             if name.startswith("_is_in_")}
    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        for name, value in flags.items():
            setattr(python_dispatch, name, value)
        mirror = "_is_in_any_mode_without_ignore_compile_internals"  # torch 2.13: also in C++
        if mirror in flags:
            python_dispatch.set_is_in_mode_without_ignore_compile_internals(flags[mirror])
    assert counted == [False, True]
    assert products()


def test_tno_on_meta_with_explicit_weights(gen):
    """Meta tensors hold no values: the weights' value checks are skipped there, so a TNO with
    explicit weights counts as on the CPU; weight='auto' (derived from coordinate values) is
    refused with a message saying what to pass."""
    n = 40
    u, x, w = torch.randn(1, n, 1), torch.rand(n, 1), torch.rand(n) + 0.1
    torch.manual_seed(0)
    model = build_model("tno_l63_y", d_model=16, n_head=2, num_layers=1)
    with torch.device("meta"):
        meta_model = build_model("tno_l63_y", d_model=16, n_head=2, num_layers=1)
    meta = [t.to("meta") for t in (u, x, w)]
    assert forward_flops(meta_model, *meta[:2], weight=meta[2]) == forward_flops(
        model, u, x, weight=w) > 0
    with pytest.raises(ValueError, match="x: weight='auto' chooses its rule .* meta tensors"):
        forward_flops(meta_model, *meta[:2])


def test_forward_flops_checks_its_model():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        forward_flops(lambda x: x, torch.zeros(2))
    with pytest.raises(ValueError, match="depth: expected an int >= 0"):
        flop_counter_mode(depth=-1)
    with pytest.raises(TypeError, match="display: expected a bool"):
        flop_counter_mode(display="x")
    linear = torch.nn.Linear(3, 5)
    assert forward_flops(linear, torch.zeros(7, 3)) == 2 * 7 * 3 * 5
