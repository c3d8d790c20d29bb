"""``draw_torch_masks``: the switch from the compiled CPU ops' dropout masks to torch's, for
runs that must repeat a model written with ``nn.Dropout`` and ``F.dropout``."""

from __future__ import annotations

from torch import nn

from .attention import SimpleAttention
from .continuum import ContinuumAttention
from .dropout import Dropout


def draw_torch_masks(module: nn.Module) -> None:
    """Every module in ``module`` with a ``torch_masks`` switch draws its masks with torch's
    dropout, in place: each :class:`Dropout`, and the dropout of the attention matrix in each
    :class:`SimpleAttention` and :class:`ContinuumAttention`. These are the masks of a model
    written with ``nn.Dropout`` and ``F.dropout`` (or SDPA's), as the original code's were, from
    the same seed."""
    for m in module.modules():
        if isinstance(m, (Dropout, SimpleAttention, ContinuumAttention)):
            m.torch_masks = True
