"""Relative L2 / H^1 errors per sample and the papers' training losses (SPEC §5,
SPEC-continuum §4).

Every error is relative per sample, then averaged over the batch, as in the papers: a field with
a small norm counts as much as a large one. A sample whose target has norm 0 has no relative
error: its ratio is inf (nan where the prediction is 0 too), and so is the batch's mean; the
:class:`~galerkin_ext.training.Trainer` names such a sample when it stops on the loss.

On a uniform grid the quadrature weight ``h^d`` cancels between numerator and denominator, so
plain sums are exact discrete norms; on other point sets :func:`relative_l2` takes the points'
quadrature weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_choice,
    check_float,
    check_nonnegative,
    first_without_weight,
    is_tracing,
)
from .._scaling import largest_magnitude
from ..data.datasets import central_gradient_1d, central_gradient_2d

__all__ = ["MaskedRelativeLoss", "OperatorLoss", "RelativeLoss", "masked_relative_l2",
           "relative_h1", "relative_h1_seminorm", "relative_l2"]

# "median": the continuum-attention paper's statistic (numpy's median: the mean of the two
# middle values for an even count).
_REDUCTIONS = ("mean", "median", "none")
_H1_FORMS = ("squares", "sum")
_LOSS_NORMS = ("l2", "h1", "h1-code")
_MASKED_REDUCTIONS = ("mean", "channel", "sample", "none")


def _check_tensor(value: object, name: str, like: Tensor | None = None) -> Tensor:
    """A floating ``(B, ...)`` tensor with ``B >= 1`` and some values per sample (the norms of
    none are 0 and their ratio NaN), on the device of ``like`` (pred) if given."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point torch.Tensor, got "
                        f"{getattr(value, 'dtype', type(value).__name__)}")
    if value.ndim < 2 or value.shape[0] < 1 or value[0].numel() == 0:
        raise ValueError(f"{name}: expected shape (B, ...) with B >= 1 and at least one axis "
                         f"besides the batch, none empty, got {tuple(value.shape)}")
    if like is not None and value.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device} like pred, got one on "
                         f"{value.device}")
    return value


def _check_reduction(reduction: object) -> str:
    return str(check_choice(reduction, "reduction", _REDUCTIONS))


def _float32_at_least(x: Tensor) -> Tensor:
    # Under bf16/fp16 autocast the model's output is half precision; norms are taken in fp32.
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _each_by_its_max(diff: Tensor, ref: Tensor, dims: tuple[int, ...]
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """``diff`` and ``ref`` each divided by its own
    :func:`~galerkin_ext._scaling.largest_magnitude` over ``dims``, and the ratio of those
    magnitudes (``dims`` dropped), by which a ratio of norms of the two is scaled back: a
    relative error is representable where the squares of either are not (an error of 1e20
    relative to 1 overflowed when ``diff`` was divided by ``ref``'s magnitude)."""
    diff_size, ref_size = largest_magnitude(diff, dims), largest_magnitude(ref, dims)
    return diff / diff_size, ref / ref_size, (diff_size / ref_size).squeeze(dims)


def _root(x: Tensor) -> Tensor:
    """``sqrt(x)`` of a sum of squares (or a ratio of two), with the slope 0 where ``x`` is 0:
    an exact prediction (or channel, or constant shift's gradient) gave sqrt's infinite slope
    times the squares' zero one, a NaN gradient, which the batch mean spread to every sample.
    (0 / 0 stays NaN.)"""
    zero = x == 0
    return torch.where(zero, 0.0, torch.where(zero, 1.0, x).sqrt())


def _reduce(per_sample: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "median":
        return per_sample.quantile(0.5)
    return per_sample


def _check_point_weight(weight: object, pred: Tensor, values: bool = True) -> Tensor:
    """Quadrature weights over the grid axes of ``pred (B, *grid, C)``: shape ``grid`` (shared
    by the batch) or ``(B, *grid)``, finite and non-negative, some positive in each sample
    (``values=False``: checked already, e.g. by :class:`RelativeLoss`); returned as
    ``(B | 1, *grid)``."""
    grid = tuple(pred.shape[1:-1])
    doc = f"{grid} or {(pred.shape[0], *grid)}"
    if not isinstance(weight, Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight: expected a floating-point tensor of shape {doc} (quadrature "
                        f"weights of the points), got {getattr(weight, 'dtype', type(weight))}")
    if not grid:
        raise ValueError(f"weight: needs pred of shape (B, *grid, C) with a grid axis, got "
                         f"{tuple(pred.shape)}")
    if tuple(weight.shape) not in (grid, (pred.shape[0], *grid)):
        raise ValueError(f"weight: expected shape {doc}, got {tuple(weight.shape)}")
    if tuple(weight.shape) == grid:
        weight = weight.unsqueeze(0)
    if values:
        check_nonnegative(weight, "weight")
        _check_some_weight(weight.flatten(1))
    return weight.to(device=pred.device)


def _check_some_weight(weight: Tensor, name: str = "weight", what: str = "weight") -> None:
    """Each sample of the non-negative weights ``weight (B | 1, n)`` has a positive one: with
    none, both norms are 0 and the error NaN (skipped while tracing)."""
    b = first_without_weight(weight, weight.shape[0], weight.shape[1])
    if b is not None:
        raise ValueError(f"{name}: sample {b} has no positive {what}")


def relative_l2(pred: Tensor, target: Tensor, reduction: str = "mean",
                weight: Tensor | None = None) -> Tensor:
    """Per-sample ``||pred - target||_2 / ||target||_2`` over all axes but the first.

    Args:
        pred, target: ``(B, ...)``, same shape (e.g. ``(B, n, 1)`` or ``(B, n, n, 1)``).
        reduction: ``'mean'`` (a scalar, the metric of the Galerkin paper's tables),
            ``'median'`` (a scalar, the continuum-attention paper's statistic) or ``'none'``
            (``(B,)``, one error per sample).
        weight: optional quadrature weights of the points, for norms on non-uniform point
            sets: ``pred`` is then read as ``(B, *grid, C)`` (the last axis holds components)
            and ``weight`` has shape ``grid`` or ``(B, *grid)``; both norms become
            ``(sum_i w_i |f_i|^2)^(1/2)``.  Only ratios of weights matter; points of weight 0
            do not count, whatever their values.
    """
    return _relative_l2(pred, target, reduction, weight)


def _relative_l2(pred: Tensor, target: Tensor, reduction: str, weight: Tensor | None,
                 check_weight_values: bool = True) -> Tensor:
    """:func:`relative_l2`; ``check_weight_values=False`` for weights checked before."""
    _check_tensor(pred, "pred")
    _check_tensor(target, "target", pred)
    if pred.shape != target.shape:
        raise ValueError(f"target: expected the shape of pred {tuple(pred.shape)}, "
                         f"got {tuple(target.shape)}")
    reduction = _check_reduction(reduction)
    pred, target = _float32_at_least(pred), _float32_at_least(target)
    dims = tuple(range(1, target.ndim))
    if weight is None:
        diff, target, scale = _each_by_its_max(pred - target, target, dims)
        err = diff.flatten(1).square().sum(1)
        ref = target.flatten(1).square().sum(1)
    else:
        w = _check_point_weight(weight, pred, check_weight_values).to(pred.dtype)
        # Points of weight 0 do not count, whatever they hold: not in the sums, not in the
        # scale (a huge value there shrank the others' squares to 0, or overflowed to inf · 0).
        counts = (w > 0).unsqueeze(-1)
        counted = torch.where(counts, target, 0.0)
        diff, target, scale = _each_by_its_max(torch.where(counts, pred - target, 0.0),
                                               counted, dims)
        err = (diff.square().sum(-1) * w).flatten(1).sum(1)
        ref = (target.square().sum(-1) * w).flatten(1).sum(1)
    return _reduce(_root(err / ref) * scale, reduction)


def masked_relative_l2(pred: Tensor, target: Tensor, mask: Tensor, *,
                       weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """Per-sample, per-channel relative L2 error of padded ragged batches (SPEC-gnot §3).

    ``e_bc = ||pred_bc - target_bc||_2 / ||target_bc||_2`` over the valid points of sample
    ``b`` (``mask``; padded points are excluded with ``where``, so whatever a model puts there,
    even NaN, does not count), or with ``weight`` the weighted
    ``sqrt(sum_i w_i (pred - target)^2 / sum_i w_i target^2)``.

    Args:
        pred, target: ``(B, N, C)``, same shape.
        mask: bool ``(B, N)``, true at valid points; every sample needs at least one.
        weight: optional non-negative ``(B, N)`` quadrature weights.
        reduction: ``'mean'`` (scalar: mean over b and c, the training loss, the reference's
            ``rel2``), ``'channel'`` (``(C,)``: mean over the batch per channel),
            ``'sample'`` (``(B,)``: mean over channels per sample) or ``'none'`` (``(B, C)``,
            e.g. to average a metric over a whole evaluation set).
    """
    _check_tensor(pred, "pred")
    _check_tensor(target, "target", pred)
    if pred.ndim != 3:
        raise ValueError(f"pred: expected shape (B, N, C), got {tuple(pred.shape)}")
    if target.shape != pred.shape:
        raise ValueError(f"target: expected the shape of pred {tuple(pred.shape)}, "
                         f"got {tuple(target.shape)}")
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != pred.shape[:2]:
        raise ValueError(f"mask: expected a bool tensor of shape {tuple(pred.shape[:2])}, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} "
                         f"{tuple(getattr(mask, 'shape', ()))}")
    check_choice(reduction, "reduction", _MASKED_REDUCTIONS)
    mask = mask.to(pred.device)
    if not is_tracing(mask) and not bool(mask.any(dim=1).all()):
        b = int((~mask.any(dim=1)).nonzero()[0])
        raise ValueError(f"mask: sample {b} has no valid point")
    pred, target = _float32_at_least(pred), _float32_at_least(target)
    valid = mask.unsqueeze(-1)
    zero = pred.new_zeros(())
    w = None
    if weight is not None:
        if not isinstance(weight, Tensor) or not weight.is_floating_point() or (
            weight.shape != mask.shape
        ):
            raise ValueError(f"weight: expected a floating tensor of shape {tuple(mask.shape)}, "
                             f"got {getattr(weight, 'dtype', type(weight).__name__)} "
                             f"{tuple(getattr(weight, 'shape', ()))}")
        w = torch.where(mask, weight.to(device=pred.device, dtype=pred.dtype), zero)
        check_nonnegative(w, "weight", "weights at valid points")
        _check_some_weight(w)
        valid = valid & (w > 0).unsqueeze(-1)  # the points that count, for the scale
    diff, target = torch.where(valid, pred - target, zero), torch.where(valid, target, zero)
    diff, target, scale = _each_by_its_max(diff, target, (1,))  # per sample and channel
    err, ref = diff.square(), target.square()
    if w is not None:
        err, ref = err * w.unsqueeze(-1), ref * w.unsqueeze(-1)
    per = _root(err.sum(1) / ref.sum(1)) * scale  # (B, C)
    if reduction == "mean":
        return per.mean()
    if reduction == "channel":
        return per.mean(0)
    if reduction == "sample":
        return per.mean(1)
    return per


class MaskedRelativeLoss(nn.Module):
    """The GNOT training loss (SPEC-gnot §3): :func:`masked_relative_l2` averaged over samples
    and channels, on padded batches of :func:`~galerkin_ext.data.gnot_datasets.collate_ragged`.

    ``weighted=True`` uses the batch's quadrature weights (the weighted variant); default
    ``False`` is the reference's plain ``rel2``.  ``forward(pred, target, mask, weight=None)``
    returns ``(loss, {'rel_l2': detached loss})``.
    """

    def __init__(self, weighted: bool = False) -> None:
        super().__init__()
        check_bool(weighted, "weighted")
        self.weighted = weighted

    def extra_repr(self) -> str:
        return f"weighted={self.weighted}"

    def forward(self, pred: Tensor, target: Tensor, mask: Tensor,
                weight: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """``(loss, parts)``; ``pred``, ``target`` ``(B, N, C)``, ``mask``/``weight``
        ``(B, N)`` (``weight`` required when ``weighted``, refused otherwise)."""
        if self.weighted and weight is None:
            raise ValueError("weight: required by a MaskedRelativeLoss(weighted=True)")
        if not self.weighted and weight is not None:  # it would be dropped without a word
            raise ValueError("weight: a MaskedRelativeLoss(weighted=False) takes no weight "
                             "(weighted=True uses it)")
        loss = masked_relative_l2(pred, target, mask, weight=weight)
        return loss, {"rel_l2": loss.detach()}


def relative_h1_seminorm(
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
            measured in the energy seminorm ``(sum a |grad e|^2 / sum a |grad u|^2)^(1/2)``
            (SPEC §5's "weighted by the coefficient a").  The paper's regulariser is the
            absolute ``||a grad e||^2`` (``a^2`` on the squares) and the original code divides
            ``sum a^2 |grad e|^2`` by ``2 sum a |grad u|^2``; with ``a`` on both sides the ratio
            is a relative error whatever the scale of ``a`` (1 for a zero prediction).
        reduction: ``'mean'``, ``'median'`` (scalars) or ``'none'`` (``(B,)``).
    """
    _check_tensor(pred, "pred")
    _check_tensor(target_grad, "target_grad", pred)
    h = check_float(h, "h")
    reduction = _check_reduction(reduction)
    pred, target_grad = _float32_at_least(pred), _float32_at_least(target_grad)
    if pred.ndim == 3:
        if coeff is not None:
            raise ValueError("coeff: the coefficient weighting is defined for 2-D fields only")
        if pred.shape[1] < 3:  # the periodic difference of 1 or 2 points is 0: an error of 1
            raise ValueError(f"pred: expected shape (B, n, C) with n >= 3 in 1-D, got "
                             f"{tuple(pred.shape)}")
        if target_grad.shape != pred.shape:
            raise ValueError(f"target_grad: expected the shape of pred {tuple(pred.shape)} "
                             f"(1-D), got {tuple(target_grad.shape)}")
        grad = central_gradient_1d(pred.movedim(1, -1), h).movedim(-1, 1)
        weight = None
    elif pred.ndim == 4:
        b, n1, n2, c = pred.shape
        if c != 1 or n1 != n2 or n1 < 3:  # (central differences need 3 nodes)
            raise ValueError(f"pred: expected shape (B, n, n, 1) with n >= 3 in 2-D, got "
                             f"{tuple(pred.shape)}")
        if target_grad.shape != (b, n1, n2, 2):
            raise ValueError(f"target_grad: expected shape {(b, n1, n2, 2)}, "
                             f"got {tuple(target_grad.shape)}")
        grad = central_gradient_2d(pred[..., 0], h)
        weight = None
        if coeff is not None:
            _check_tensor(coeff, "coeff", pred)
            if coeff.shape != pred.shape:
                raise ValueError(f"coeff: expected the shape of pred {tuple(pred.shape)}, "
                                 f"got {tuple(coeff.shape)}")
            # (a negative or zero one makes the energy seminorm's ratio meaningless)
            check_nonnegative(coeff, "coeff", "coefficient values")
            # (the differences are zero on the boundary ring: a weight there alone gives 0/0)
            _check_some_weight(coeff[:, 1:-1, 1:-1].flatten(1), "coeff",
                               "value at an interior node")
            weight = _float32_at_least(coeff)
    else:
        raise ValueError(f"pred: expected (B, n, C) in 1-D or (B, n, n, 1) in 2-D, "
                         f"got {tuple(pred.shape)}")
    diff, target_grad, scale = _each_by_its_max(grad - target_grad, target_grad,
                                                tuple(range(1, target_grad.ndim)))
    err, ref = diff.square(), target_grad.square()
    if weight is not None:
        err, ref = err * weight, ref * weight
    return _reduce(_root(err.flatten(1).sum(1) / ref.flatten(1).sum(1)) * scale, reduction)


def relative_h1(
    pred: Tensor,
    target: Tensor,
    h: float,
    reduction: str = "mean",
    form: str = "squares",
    *,
    periodic: bool = False,
) -> Tensor:
    """Per-sample relative H^1 error of 2-D fields on a uniform grid (SPEC-continuum §4).

    ``form='squares'``: ``||e||_{H^1} / ||y||_{H^1}`` with ``||f||^2_{H^1} = ||f||^2 +
    ||grad f||^2`` (``e = pred - target``, ``y = target``), gradients by the central
    differences of :func:`~galerkin_ext.data.datasets.central_gradient_2d` (interior nodes, the
    boundary ring has none; with ``periodic``, every point of a periodic grid, wrapping
    around).  ``form='sum'``: the authors' code, ``(||e|| + ||grad e||) / (||y|| + ||grad
    y||)`` with ``torch.gradient``'s differences (central inside, one-sided on the boundary
    ring; never periodic).  ``h``: the spacing -- the physical one (``1 / (s - 1)`` for nodes
    on the unit square, ``2 pi / s`` on the periodic ``[0, 2 pi)^2``), or ``1`` for the
    authors' index spacing.  The cell area ``h^2`` cancels in the ratio.

    Args:
        pred, target: ``(B, s1, s2, C)``, same shape, ``s1, s2 >= 3``; the components are
            summed in the norms.
        h: grid spacing of both axes.
        reduction: ``'mean'``, ``'median'`` or ``'none'`` (``(B,)``).
        form: ``'squares'`` or ``'sum'``.
        periodic: the fields live on a periodic grid (Kolmogorov flow); ``'squares'`` only.
    """
    _check_tensor(pred, "pred")
    _check_tensor(target, "target", pred)
    if pred.ndim != 4 or min(pred.shape[1:3]) < 3:
        raise ValueError(f"pred: expected shape (B, s1, s2, C) with s1, s2 >= 3, "
                         f"got {tuple(pred.shape)}")
    if target.shape != pred.shape:
        raise ValueError(f"target: expected the shape of pred {tuple(pred.shape)}, "
                         f"got {tuple(target.shape)}")
    h = check_float(h, "h")
    reduction = _check_reduction(reduction)
    check_choice(form, "form", _H1_FORMS)
    check_bool(periodic, "periodic")
    if periodic and form == "sum":
        raise ValueError("periodic: the 'sum' form is the authors' code, whose differences are "
                         "one-sided on the boundary, never periodic; use form='squares'")
    pred, target = _float32_at_least(pred), _float32_at_least(target)
    err, ref, scale = _each_by_its_max(pred - target, target, tuple(range(1, target.ndim)))

    def squares(f: Tensor) -> tuple[Tensor, Tensor]:
        if form == "squares":
            grad = central_gradient_2d(f.movedim(-1, 1), h, periodic=periodic)  # (B,C,s1,s2,2)
            gradient_squares = grad.flatten(1).square().sum(1)
        else:
            g1, g2 = torch.gradient(f, spacing=h, dim=(1, 2))
            gradient_squares = g1.flatten(1).square().sum(1) + g2.flatten(1).square().sum(1)
        return f.flatten(1).square().sum(1), gradient_squares

    (e0, e1), (y0, y1) = squares(err), squares(ref)
    if form == "squares":
        per_sample = _root((e0 + e1) / (y0 + y1))
    else:
        per_sample = (_root(e0) + _root(e1)) / (_root(y0) + _root(y1))
    return _reduce(per_sample * scale, reduction)


class RelativeLoss(nn.Module):
    """The continuum-attention paper's training loss (SPEC-continuum §4, Remark 24): the batch
    mean of per-sample relative errors.

    * ``norm='l2'``: :func:`relative_l2`, with the points' quadrature ``weight`` if given
      (shape ``grid`` of the training data; ``None``: plain sums); ``h`` is unused (checked,
      so that a script may pass its grid's spacing whatever the norm);
    * ``norm='h1'``: :func:`relative_h1` at the physical spacing ``h`` (2-D);
    * ``norm='h1-code'``: the authors' ``(||e|| + ||grad e||) / (||y|| + ||grad y||)`` at index
      spacing (``h`` is ignored), with their differences (:func:`relative_h1`'s ``'sum'``).

    ``periodic``: the ``'h1'`` loss takes periodic differences (fields on a periodic grid,
    e.g. the Kolmogorov flow); it does not change ``'l2'``, and ``'h1-code'`` has none.

    ``forward(pred, target, target_grad=None, coeff=None)`` (the
    :class:`~galerkin_ext.training.Trainer`'s loss signature; the last two are unused) returns
    ``(loss, parts)`` with the detached ``parts['rel_l2']`` (the relative L2 error of the
    batch, weighted like the loss) and, for the H^1 losses, ``parts['rel_h1']`` (the loss).
    """

    def __init__(self, norm: str = "l2", *, h: float | None = None,
                 weight: Tensor | None = None, periodic: bool = False) -> None:
        super().__init__()
        check_bool(periodic, "periodic")
        check_choice(norm, "norm", _LOSS_NORMS)
        if periodic and norm == "h1-code":
            raise ValueError("periodic: 'h1-code' is the authors' loss, whose differences are "
                             "never periodic; use norm='h1' for periodic ones")
        if norm == "h1" or h is not None:
            h = check_float(h, "h")
        if weight is not None and norm != "l2":
            raise ValueError("weight: quadrature weights apply to norm='l2' only (the H^1 "
                             "losses are for uniform 2-D grids)")
        if weight is not None and (not isinstance(weight, Tensor)
                                   or not weight.is_floating_point()):
            raise TypeError(f"weight: expected a floating-point tensor or None, got "
                            f"{getattr(weight, 'dtype', type(weight).__name__)}")
        if weight is not None:  # checked once here, not by every forward (a host sync each)
            check_nonnegative(weight, "weight")
            if first_without_weight(weight.reshape(1, -1), 1, weight.numel()) is not None:
                raise ValueError("weight: expected some positive weight, all are 0")
        self.norm = norm
        self.h = None if h is None else float(h)
        # A buffer, so that .to(device)/.double() move it with the model; not in the state_dict
        # (the weights belong to the data, not to what training learns).
        self.weight: Tensor | None
        self.register_buffer("weight", weight, persistent=False)
        self.periodic = periodic

    def extra_repr(self) -> str:
        return (f"norm={self.norm!r}, h={self.h}, weighted={self.weight is not None}, "
                f"periodic={self.periodic}")

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        target_grad: Tensor | None = None,
        coeff: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``(loss, parts)``; ``pred``, ``target`` ``(B, *grid, C)``."""
        del target_grad, coeff  # the gradients are taken here; no coefficient weighting
        if self.norm == "l2":
            loss = _relative_l2(pred, target, "mean", self.weight, check_weight_values=False)
            return loss, {"rel_l2": loss.detach()}
        if self.norm == "h1":
            loss = relative_h1(pred, target, self.h,  # type: ignore[arg-type]
                               periodic=self.periodic)
        else:
            loss = relative_h1(pred, target, 1.0, form="sum")
        return loss, {"rel_l2": relative_l2(pred.detach(), target), "rel_h1": loss.detach()}


class OperatorLoss(nn.Module):
    """The paper's training loss: ``mean_b relL2_b + sqrt(gamma h) mean_b relH1_b`` (SPEC §5).

    ``gamma = 0`` gives the plain relative L2 loss (inverse problem); Burgers uses
    ``gamma = 0.1``, Darcy ``gamma = 0.5`` with ``coefficient_weighted=True`` (the H^1 term in
    the energy seminorm of the coefficient ``a``, so high-conductivity regions count more).
    ``h`` is the grid spacing of the training resolution (``1/n`` periodic 1-D,
    ``1/(n-1)`` for 2-D nodes).

    ``forward(pred, target, target_grad=None, coeff=None)`` with ``pred``/``target``
    ``(B, n, C)`` or ``(B, n, n, 1)`` returns ``(loss, parts)``: the scalar loss and a dict of
    detached scalars ``{'rel_l2', 'rel_h1'}`` (``rel_h1``, the H¹-seminorm error, only when
    ``gamma > 0``).
    """

    def __init__(self, gamma: float = 0.0, h: float | None = None,
                 coefficient_weighted: bool = False) -> None:
        super().__init__()
        gamma = check_float(gamma, "gamma", low_inclusive=True)
        if gamma > 0 and h is None:
            raise ValueError("h: expected the grid spacing (a float > 0) when gamma > 0, got None")
        if h is not None:
            h = check_float(h, "h")
        check_bool(coefficient_weighted, "coefficient_weighted")
        self.gamma, self.h = gamma, h
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
        rel_h1 = relative_h1_seminorm(pred, target_grad, self.h,
                                      coeff if self.coefficient_weighted else None)
        parts["rel_h1"] = rel_h1.detach()
        return rel_l2 + math.sqrt(self.gamma * self.h) * rel_h1, parts
