"""A tour of the attention ops: Galerkin and Fourier attention on a 1-D mesh, both Fourier paths,
irregular quadrature weights with padding, gradients, and the speed of the compiled ops against
the original-style formulas.

    python examples/attention_demo.py
"""

import argparse
import time

import torch

from galerkin_ext import ops, reference

# no options: --help says what the tour does
argparse.ArgumentParser(description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
torch.manual_seed(0)
B, H, N, D = 4, 4, 2048, 32  # batch, heads, points, features per head
device = "cuda" if torch.cuda.is_available() and ops.cuda_built() else "cpu"
print(f"galerkin_ext on {device}; CUDA kernels built: {ops.cuda_built()}")

# Q, K, V as a model's projections would give them, the mesh coordinates, and per-head
# layer-norm parameters (the paper's "Ln on K, V" / "Ln on Q, K" schemes).
q, k, v = (torch.randn(B, H, N, D, device=device, requires_grad=True) for _ in range(3))
x = torch.linspace(0, 1, N, device=device)[:, None]  # (N, P=1), shared by the batch
norm = (torch.ones(H, D, device=device), torch.zeros(H, D, device=device))

galerkin = ops.galerkin_attention(q, k, v, pos=x, k_norm=norm, v_norm=norm)
print(f"galerkin_attention: {tuple(q.shape)} -> {tuple(galerkin.shape)} (coordinates in front)")
expected = reference.galerkin_attention(q, k, v, pos=x, k_norm=norm, v_norm=norm)
print(f"  max |ours - reference| = {(galerkin - expected).abs().max().item():.2e}")

# Without softmax, (QKᵀ)V = Q(KᵀV): the factored path never forms the N×N matrix.
factored = ops.fourier_attention(q, k, v, pos=x, q_norm=norm, k_norm=norm, path="factored")
quadratic = ops.fourier_attention(q, k, v, pos=x, q_norm=norm, k_norm=norm, path="quadratic")
print(f"fourier_attention: factored vs quadratic path differ by "
      f"{(factored - quadratic).abs().max().item():.2e}")

# Quadrature weights: a non-uniform mesh, and variable-length samples padded with w = 0.
lengths = torch.tensor([N, N // 2, N // 4, 3 * N // 4], device=device)
weight = (torch.arange(N, device=device) < lengths[:, None]).float() / lengths[:, None]
padded = ops.galerkin_attention(q, k, v, pos=x, weight=weight, k_norm=norm, v_norm=norm)
n = N // 4
alone = ops.galerkin_attention(q[2:3, :, :n], k[2:3, :, :n], v[2:3, :, :n], pos=x[:n],
                               k_norm=norm, v_norm=norm)
print(f"padding with zero weights is exact: {(padded[2:3, :, :n] - alone).abs().max().item():.2e}")

# Gradients flow to q, k, v (and to the norm parameters, pos and weight when they need them).
galerkin.square().mean().backward()
print(f"grad norms: q {q.grad.norm():.3e}, k {k.grad.norm():.3e}, v {v.grad.norm():.3e}")


def timed(fn, reps=3):
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def step(module, kind):
    def run():
        fn = module.galerkin_attention if kind == "galerkin" else module.fourier_attention
        norms = dict(k_norm=norm, v_norm=norm) if kind == "galerkin" else dict(q_norm=norm,
                                                                               k_norm=norm)
        fn(q, k, v, pos=x, **norms).square().mean().backward()
    return run


print(f"forward + backward at B={B}, H={H}, N={N}, D={D} (benchmarks/attention.py for more):")
for kind in ("galerkin", "fourier"):
    ours, eager = timed(step(ops, kind)), timed(step(reference, kind))
    print(f"  {kind:8s} ours {ours:8.1f} ms   original-style {eager:8.1f} ms   "
          f"{eager / ours:5.1f}x")
