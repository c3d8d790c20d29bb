"""Floating-point care that several modules share.

Sums of squares that neither underflow nor overflow: a quantity homogeneous in its inputs
(a relative error, a length or area, a standard deviation) is taken on the inputs divided by
their largest magnitude and scaled back. Squares of 1e-23 float32 values are 0 and of 1e20
inf, where the quantity itself is representable.

Whole step counts that a quotient's rounding does not push up by one (:func:`fewest_steps`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def largest_magnitude(x: Tensor, dims: int | tuple[int, ...]) -> Tensor:
    """``max |x|`` over ``dims`` (kept as size-1 axes), detached; 1 where it is 0 (``x`` is 0
    there and stands for its own quotient) or not finite (so that inf stays inf and NaN NaN,
    not inf / inf)."""
    size = x.detach().abs().amax(dim=dims, keepdim=True)
    return torch.where((size > 0) & size.isfinite(), size, torch.ones_like(size))


def fewest_steps(length: float, max_step: float) -> int:
    """Fewest whole steps of at most ``max_step`` covering ``length``, up to a relative 1e-9
    (0.07 / 0.01 is 7.000000000000001 and 16.1 / 1e-3 is 16100.000000000002 in floating point:
    7 and 16100 steps, not one more)."""
    ratio = length / max_step
    return max(1, math.ceil(ratio - 1e-9 * max(1.0, ratio)))
