"""Losses and the evaluation metric of the papers' experiments (SPEC §5, SPEC-continuum §4).

* :func:`relative_l2` -- per-sample relative L2 error, the evaluation metric (mean or median;
  optionally with the points' quadrature weights);
* :func:`relative_h1` -- per-sample relative H^1 error of 2-D fields at a given spacing;
* :func:`relative_h1_seminorm` -- per-sample relative H^1-seminorm error by central differences,
  optionally weighted by a coefficient (the Darcy energy norm);
* :class:`OperatorLoss` -- the training loss ``mean(rel L2) + sqrt(gamma h) mean(rel H^1)``;
* :class:`RelativeLoss` -- the continuum-attention training loss (relative L2 or H^1);
* :func:`masked_relative_l2` -- per-sample, per-channel relative L2 of padded ragged batches
  (GNOT, SPEC-gnot §3), plain or weighted;
* :class:`MaskedRelativeLoss` -- the GNOT training loss built on it.
"""

from .relative import (
    MaskedRelativeLoss,
    OperatorLoss,
    RelativeLoss,
    masked_relative_l2,
    relative_h1,
    relative_h1_seminorm,
    relative_l2,
)

__all__ = ["MaskedRelativeLoss", "OperatorLoss", "RelativeLoss", "masked_relative_l2",
           "relative_h1", "relative_h1_seminorm", "relative_l2"]
