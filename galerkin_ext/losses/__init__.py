"""Losses and the evaluation metric of the papers' experiments (SPEC §5, SPEC-continuum §4).

* :func:`relative_l2` -- per-sample relative L2 error, the evaluation metric (mean or median;
  optionally with the points' quadrature weights);
* :func:`relative_h1` -- per-sample relative H^1 error of 2-D fields at a given spacing;
* :func:`relative_h1_error` -- per-sample relative H^1-seminorm error by central differences,
  optionally weighted by a coefficient (the Darcy energy norm);
* :class:`OperatorLoss` -- the training loss ``mean(rel L2) + sqrt(gamma h) mean(rel H^1)``;
* :class:`RelativeLoss` -- the continuum-attention training loss (relative L2 or H^1).
"""

from .relative import (
    OperatorLoss,
    RelativeLoss,
    relative_h1,
    relative_h1_error,
    relative_l2,
)

__all__ = ["OperatorLoss", "RelativeLoss", "relative_h1", "relative_h1_error", "relative_l2"]
