"""Sums of squares that neither underflow nor overflow: a quantity homogeneous in its inputs
(a relative error, a length or area, a standard deviation) is taken on the inputs divided by
their largest magnitude and scaled back. Squares of 1e-23 float32 values are 0 and of 1e20
inf, where the quantity itself is representable."""

from __future__ import annotations

import torch
from torch import Tensor


def largest_magnitude(x: Tensor, dims: int | tuple[int, ...]) -> Tensor:
    """``max |x|`` over ``dims`` (kept as size-1 axes), detached; 1 where it is 0 (``x`` is 0
    there and stands for its own quotient)."""
    size = x.detach().abs().amax(dim=dims, keepdim=True)
    return torch.where(size > 0, size, torch.ones_like(size))
