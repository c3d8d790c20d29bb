"""Relative L2 / H^1 errors per sample and the paper's training loss (SPEC §5).

Every error is relative per sample, then averaged over the batch, as in the paper: a field with
a small norm counts as much as a large one.  On a uniform grid the quadrature weight ``h^d``
cancels between numerator and denominator, so plain sums are exact discrete norms.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..data.datasets import central_gradient_1d, central_gradient_2d

__all__ = ["OperatorLoss", "relative_h1_error", "relative_l2"]

_REDUCTIONS = ("mean", "none")


def _check_tensor(value: object, name: str) -> Tensor:
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point torch.Tensor, got "
                        f"{getattr(value, 'dtype', type(value).__name__)}")
    if value.ndim < 2 or value.shape[0] < 1:
        raise ValueError(f"{name}: expected shape (B, ...) with B >= 1 and at least one axis "
                         f"besides the batch, got {tuple(value.shape)}")
    return value


def _check_reduction(reduction: object) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction: expected one of {_REDUCTIONS}, got {reduction!r}")
    return str(reduction)


def _float32_at_least(x: Tensor) -> Tensor:
    # Under bf16/fp16 autocast the model's output is half precision; norms are taken in fp32.
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _reduce(per_sample: Tensor, reduction: str) -> Tensor:
    return per_sample.mean() if reduction == "mean" else per_sample


def relative_l2(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Per-sample ``||pred - target||_2 / ||target||_2`` over all axes but the first.

    Args:
        pred, target: ``(B, ...)``, same shape (e.g. ``(B, n, 1)`` or ``(B, n, n, 1)``).
        reduction: ``'mean'`` (a scalar, the metric of the paper's tables) or ``'none'``
            (``(B,)``, one error per sample).
    """
    _check_tensor(pred, "pred")
    _check_tensor(target, "target")
    if pred.shape != target.shape:
        raise ValueError(f"target: expected the shape of pred {tuple(pred.shape)}, "
                         f"got {tuple(target.shape)}")
    reduction = _check_reduction(reduction)
    pred, target = _float32_at_least(pred), _float32_at_least(target)
    err = (pred - target).flatten(1).square().sum(1)
    ref = target.flatten(1).square().sum(1)
    return _reduce((err / ref).sqrt(), reduction)


def relative_h1_error(
    pred: Tensor,
    target_grad: Tensor,
    h: float,
    coeff: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Per-sample relative H^1-seminorm error ``|pred - u|_1 / |u|_1`` by central differences.

    The gradient of ``pred`` is taken with the same central differences the datasets use for
    ``target_grad`` (:func:`~galerkin_ext.data.datasets.central_gradient_1d`, periodic, and
    :func:`~galerkin_ext.data.datasets.central_gradient_2d`, interior nodes only).

    Args:
        pred: 1-D ``(B, n, C)`` (periodic grid) or 2-D ``(B, n, n, 1)`` (nodes incl. boundary).
        target_grad: the target's gradient, ``(B, n, C)`` in 1-D, ``(B, n, n, 2)`` in 2-D.
        h: the grid spacing used for ``target_grad``.
        coeff: optional non-negative weight ``a`` ``(B, n, n, 1)`` (2-D only): the error is then
            measured in the energy seminorm ``(sum a |grad e|^2 / sum a |grad u|^2)^(1/2)``.
        reduction: ``'mean'`` (scalar) or ``'none'`` (``(B,)``).
    """
    _check_tensor(pred, "pred")
    _check_tensor(target_grad, "target_grad")
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not (math.isfinite(h) and h > 0):
        raise ValueError(f"h: expected a finite float > 0 (the grid spacing), got {h!r}")
    reduction = _check_reduction(reduction)
    pred, target_grad = _float32_at_least(pred), _float32_at_least(target_grad)
    if pred.ndim == 3:
        if coeff is not None:
            raise ValueError("coeff: the coefficient weighting is defined for 2-D fields only")
        if target_grad.shape != pred.shape:
            raise ValueError(f"target_grad: expected the shape of pred {tuple(pred.shape)} "
                             f"(1-D), got {tuple(target_grad.shape)}")
        grad = central_gradient_1d(pred.movedim(1, -1), h).movedim(-1, 1)
        weight = None
    elif pred.ndim == 4:
        b, n1, n2, c = pred.shape
        if c != 1 or n1 != n2:
            raise ValueError(f"pred: expected shape (B, n, n, 1) in 2-D, got {tuple(pred.shape)}")
        if target_grad.shape != (b, n1, n2, 2):
            raise ValueError(f"target_grad: expected shape {(b, n1, n2, 2)}, "
                             f"got {tuple(target_grad.shape)}")
        grad = central_gradient_2d(pred[..., 0], h)
        weight = None
        if coeff is not None:
            _check_tensor(coeff, "coeff")
            if coeff.shape != pred.shape:
                raise ValueError(f"coeff: expected the shape of pred {tuple(pred.shape)}, "
                                 f"got {tuple(coeff.shape)}")
            weight = _float32_at_least(coeff)
    else:
        raise ValueError(f"pred: expected (B, n, C) in 1-D or (B, n, n, 1) in 2-D, "
                         f"got {tuple(pred.shape)}")
    err = (grad - target_grad).square()
    ref = target_grad.square()
    if weight is not None:
        err, ref = err * weight, ref * weight
    return _reduce((err.flatten(1).sum(1) / ref.flatten(1).sum(1)).sqrt(), reduction)


class OperatorLoss(nn.Module):
    """The paper's training loss: ``mean_b relL2_b + sqrt(gamma h) mean_b relH1_b`` (SPEC §5).

    ``gamma = 0`` gives the plain relative L2 loss (inverse problem); Burgers uses
    ``gamma = 0.1``, Darcy ``gamma = 0.5`` with ``coefficient_weighted=True`` (the H^1 term in
    the energy seminorm of the coefficient ``a``, so high-conductivity regions count more).
    ``h`` is the grid spacing of the training resolution (``1/n`` periodic 1-D,
    ``1/(n-1)`` for 2-D nodes).

    ``forward(pred, target, target_grad=None, coeff=None)`` with ``pred``/``target``
    ``(B, n, C)`` or ``(B, n, n, 1)`` returns ``(loss, parts)``: the scalar loss and a dict of
    detached scalars ``{'rel_l2', 'rel_h1'}`` (``rel_h1`` only when ``gamma > 0``).
    """

    def __init__(self, gamma: float = 0.0, h: float | None = None,
                 coefficient_weighted: bool = False) -> None:
        super().__init__()
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (
            math.isfinite(gamma) and gamma >= 0
        ):
            raise ValueError(f"gamma: expected a finite float >= 0, got {gamma!r}")
        if gamma > 0 and (isinstance(h, bool) or not isinstance(h, (int, float))
                          or not (math.isfinite(h) and h > 0)):
            raise ValueError(f"h: expected the grid spacing (a float > 0) when gamma > 0, "
                             f"got {h!r}")
        if not isinstance(coefficient_weighted, bool):
            raise TypeError(f"coefficient_weighted: expected a bool, got {coefficient_weighted!r}")
        self.gamma, self.h = float(gamma), None if h is None else float(h)
        self.coefficient_weighted = coefficient_weighted

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, h={self.h}, coefficient_weighted={self.coefficient_weighted}"

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        target_grad: Tensor | None = None,
        coeff: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``(loss, {'rel_l2': ..., 'rel_h1': ...})``, see the class doc for the shapes."""
        rel_l2 = relative_l2(pred, target)
        parts = {"rel_l2": rel_l2.detach()}
        if self.gamma == 0:
            return rel_l2, parts
        if target_grad is None:
            raise ValueError("target_grad: required when gamma > 0 (the H^1 term)")
        if self.coefficient_weighted and coeff is None:
            raise ValueError("coeff: required when coefficient_weighted=True")
        assert self.h is not None  # checked in __init__ for gamma > 0
        rel_h1 = relative_h1_error(pred, target_grad, self.h,
                                   coeff if self.coefficient_weighted else None)
        parts["rel_h1"] = rel_h1.detach()
        return rel_l2 + math.sqrt(self.gamma * self.h) * rel_h1, parts
