"""``Denormalizer``: undoes a (pointwise) unit-Gaussian normalisation of a model's targets.

The statistics live in buffers, so they travel with ``state_dict`` and ``.to(device)``; the
trainer sets them once it has fitted its normaliser on the training targets.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._checks import check_float, check_statistics


class Denormalizer(nn.Module):
    """``y = x · scale + shift`` with ``scale = std + eps`` and ``shift = mean``.

    Until :meth:`set_statistics` is called it is the identity (``scale = 1``, ``shift = 0``,
    both 0-dim). Pointwise statistics, e.g. ``(n, n, 1)`` for outputs ``(B, n, n, 1)``, must
    broadcast to the output without changing its shape.

    Loading a ``state_dict`` resizes the buffers to the stored statistics, so a freshly built
    model takes a trained model's weights and normaliser in one ``load_state_dict``.
    """

    shift: Tensor
    scale: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(()))
        self.register_buffer("scale", torch.ones(()))

    @torch.no_grad()
    def set_statistics(self, mean: Tensor, std: Tensor, eps: float = 1e-5) -> None:
        """Use ``mean`` and ``std`` (same shape, ``std >= 0``) of the normalised targets."""
        check_statistics(mean, std)
        eps = check_float(eps, "eps", low_inclusive=True)
        like: dict[str, Any] = {"dtype": self.scale.dtype, "device": self.scale.device}
        self.shift = mean.detach().to(**like).clone()
        self.scale = (std.detach().to(**like) + eps).clone()

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, *shape)`` → ``x · scale + shift``, same shape."""
        stats = self.scale.shape
        # Equal-length zip of the trailing dims (torch 2.5's dynamo fails on unequal ones).
        if len(stats) > x.dim() or any(
            s not in (1, d) for s, d in zip(stats, x.shape[x.dim() - len(stats):], strict=True)
        ):
            raise ValueError(f"x: expected a shape the statistics {tuple(self.scale.shape)} "
                             f"broadcast to, got {tuple(x.shape)}; were they fitted at another "
                             "resolution?")
        return torch.addcmul(self.shift, x, self.scale)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any, **kwargs: Any) -> None:
        # Statistics fitted on a grid have that grid's shape; take it from the stored tensors.
        for name in ("shift", "scale"):
            stored = state_dict.get(prefix + name)
            current = getattr(self, name)
            if isinstance(stored, Tensor) and stored.shape != current.shape:
                setattr(self, name, current.new_empty(stored.shape))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
