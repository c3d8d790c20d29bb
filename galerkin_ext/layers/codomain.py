"""Codomain attention (the continuum-attention paper's Remark 16; Rahman et al. 2024's CoDA-NO):
patched attention whose tokens are the channels of a field instead of its patches.

A field ``u : D → R^C`` on a 2-D periodic grid gives ``C`` tokens, the scalar functions
``u_j : D → R``. ``Q``, ``K``, ``V`` are Fourier integral operators from one channel to
``H · d`` channels, the same for every token; tokens are compared by the ``L²(D)`` inner product
with the grid's cell volume (:func:`galerkin_ext.ops.patched_attention`, the one patch being the
whole domain), and a pointwise ``Linear(H · d, 1)``, also shared, maps each token's output back
to one channel. So the layer

* takes any number of channels ``C`` (the variables of a multiphysics system), and permuting the
  input channels permutes the output channels the same way;
* is a discretisation of one operator: a band-limited input gives the same output on every grid
  that resolves it.
"""

from __future__ import annotations

from torch import Tensor, nn

from .. import ops
from .._checks import check_int, check_scale, check_tensor
from .fourier import SpectralConv

__all__ = ["CodomainAttention"]


class CodomainAttention(nn.Module):
    """Multi-head attention among the channels of ``x (B, s₁, s₂, C)``, each a function on the
    periodic grid; returns ``(B, s₁, s₂, C)``.

    Token ``j``'s query, key and value are ``Q u_j``, ``K u_j``, ``V u_j``, each ``d``-channel
    functions per head from one :class:`~galerkin_ext.layers.SpectralConv` ``(1, 3 H d,
    modes)``; head ``h`` weighs the values by ``softmax_k(scale · ⟨Q_h u_j, K_h u_k⟩_{L²(D)})``
    (cell volume ``1 / (s₁ s₂)``: the domain has volume 1, as the models' coordinates do); the
    heads' outputs are mapped back to channel ``j`` by ``Linear(H d, 1)``.

    Args:
        token_dim: ``d``, the channels of each head's query, key and value functions.
        n_head: heads ``H``.
        modes: the spectral operators' retained wavenumbers per axis (mode skipping as
            :class:`~galerkin_ext.layers.SpectralConv`: any grid runs).
        scale: the logits' factor (``None``: 1, the continuum paper's choice).

    Parameters: ``3 H d · 2 modes²`` complex for ``Q``, ``K``, ``V`` and ``H d + 1`` real.
    """

    def __init__(self, token_dim: int, n_head: int, modes: int, *,
                 scale: float | None = None) -> None:
        super().__init__()
        self.token_dim = check_int(token_dim, "token_dim")
        self.n_head = check_int(n_head, "n_head")
        self.scale = check_scale(scale, 1.0)
        width = n_head * token_dim
        self.qkv = SpectralConv(1, 3 * width, check_int(modes, "modes"))
        self.out_proj = nn.Linear(width, 1)

    def extra_repr(self) -> str:
        return f"token_dim={self.token_dim}, n_head={self.n_head}, scale={self.scale:g}"

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, s₁, s₂, C)`` → ``(B, s₁, s₂, C)``, attention across the ``C`` channels."""
        check_tensor(x, "x", 4, "(B, s1, s2, C)", self)
        batch, s1, s2, channels = x.shape
        if 0 in (s1, s2, channels):
            raise ValueError(f"x: expected shape (B, s1, s2, C) with s1, s2, C >= 1, got "
                             f"{tuple(x.shape)}")
        n, heads, d = s1 * s2, self.n_head, self.token_dim
        # every channel a one-channel field of the batch: (B·C, s1, s2, 1)
        tokens = x.permute(0, 3, 1, 2).reshape(batch * channels, s1, s2, 1)
        qkv = self.qkv(tokens).view(batch, channels, n, 3, heads, d)
        q, k, v = (qkv[:, :, :, i].permute(0, 3, 1, 2, 4) for i in range(3))  # (B, H, C, n, d)
        out = ops.patched_attention(q, k, v, 1.0 / n, scale=self.scale)
        out = self.out_proj(out.permute(0, 2, 3, 1, 4).reshape(batch, channels, n, heads * d))
        return out.view(batch, channels, s1, s2).permute(0, 2, 3, 1)
