"""Losses and the evaluation metric of the paper's experiments (SPEC §5).

* :func:`relative_l2` -- per-sample relative L2 error, the evaluation metric;
* :func:`relative_h1_error` -- per-sample relative H^1-seminorm error by central differences,
  optionally weighted by a coefficient (the Darcy energy norm);
* :class:`OperatorLoss` -- the training loss ``mean(rel L2) + sqrt(gamma h) mean(rel H^1)``.
"""

from .relative import OperatorLoss, relative_h1_error, relative_l2

__all__ = ["OperatorLoss", "relative_h1_error", "relative_l2"]
