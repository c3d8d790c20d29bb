"""``Dropout``: the layers' and models' dropout module, on :func:`galerkin_ext.ops.dropout`."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .. import ops
from .._checks import check_probability


class Dropout(nn.Dropout):
    """``nn.Dropout`` (not in place) whose CPU mask comes from the compiled op
    :func:`galerkin_ext.ops.dropout`; torch's dropout elsewhere, and wherever ``torch_masks``
    is set (:func:`~galerkin_ext.layers.draw_torch_masks`). ``p`` in ``[0, 1)``.

    Input and output: any shape.
    """

    torch_masks: bool = False

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(check_probability(p, "p"))

    def forward(self, x: Tensor) -> Tensor:
        if self.torch_masks:
            return F.dropout(x, self.p, self.training)
        return ops.dropout(x, self.p, self.training)
