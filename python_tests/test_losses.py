"""Losses and the metric (SPEC §5): exact values on constructed fields, shapes, errors."""

import math

import pytest
import torch

from galerkin_ext.data.datasets import central_gradient_1d, central_gradient_2d
from galerkin_ext.losses import OperatorLoss, relative_h1_error, relative_l2


def _periodic_field(b: int, n: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.arange(n, dtype=torch.float64) / n
    amp = torch.randn(b, 3, generator=gen, dtype=torch.float64)
    k = torch.arange(1, 4, dtype=torch.float64)
    return (amp[:, :, None] * torch.sin(2 * math.pi * k[None, :, None] * x)).sum(1)[..., None]


def test_relative_l2_values(gen):
    target = torch.randn(5, 64, 1, generator=gen, dtype=torch.float64)
    noise = torch.randn(5, 64, 1, generator=gen, dtype=torch.float64)
    pred = target + noise
    per = relative_l2(pred, target, reduction="none")
    assert per.shape == (5,)
    expected = noise.flatten(1).norm(dim=1) / target.flatten(1).norm(dim=1)
    torch.testing.assert_close(per, expected)
    torch.testing.assert_close(relative_l2(pred, target), expected.mean())
    # scale invariance: a per-sample relative error ignores the sample's magnitude
    scale = torch.tensor([1.0, 1e-3, 1e3, 2.0, 0.5], dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(relative_l2(pred * scale, target * scale, "none"), expected)
    assert relative_l2(target, target).item() == 0.0


def test_relative_h1_1d_matches_definition(gen):
    u = _periodic_field(4, 128, gen)
    h = 1 / 128
    du = central_gradient_1d(u[..., 0], h)[..., None]
    # pred = 1.5 u: the gradient error is exactly half the gradient -> relative error 0.5
    torch.testing.assert_close(relative_h1_error(1.5 * u, du, h, reduction="none"),
                               torch.full((4,), 0.5, dtype=torch.float64))
    # adding a constant does not change the H^1 seminorm
    assert relative_h1_error(u + 3.0, du, h).item() < 1e-12
    e = torch.randn(4, 128, 1, generator=gen, dtype=torch.float64)
    de = central_gradient_1d(e[..., 0], h)[..., None]
    expected = de.flatten(1).norm(dim=1) / du.flatten(1).norm(dim=1)
    torch.testing.assert_close(relative_h1_error(u + e, du, h, reduction="none"), expected)


def test_relative_h1_2d_coefficient_weighted(gen):
    n, h = 17, 1 / 16
    u = torch.randn(3, n, n, generator=gen, dtype=torch.float64)
    du = central_gradient_2d(u, h)
    e = torch.randn(3, n, n, generator=gen, dtype=torch.float64)
    de = central_gradient_2d(e, h)
    a = torch.where(torch.rand(3, n, n, generator=gen) > 0.5, 12.0, 3.0).double()
    pred = (u + e)[..., None]
    plain = relative_h1_error(pred, du, h, reduction="none")
    torch.testing.assert_close(plain, de.flatten(1).norm(dim=1) / du.flatten(1).norm(dim=1))
    weighted = relative_h1_error(pred, du, h, coeff=a[..., None], reduction="none")
    num = (a[..., None] * de.square()).flatten(1).sum(1)
    den = (a[..., None] * du.square()).flatten(1).sum(1)
    torch.testing.assert_close(weighted, (num / den).sqrt())
    # a constant coefficient cancels; a varying one changes the value
    torch.testing.assert_close(relative_h1_error(pred, du, h, coeff=torch.full_like(pred, 7.0),
                                                 reduction="none"), plain)
    assert not torch.allclose(weighted, plain)


def test_operator_loss_combines_terms(gen):
    u = _periodic_field(4, 64, gen)
    h = 1 / 64
    du = central_gradient_1d(u[..., 0], h)[..., None]
    pred = (u + 0.1 * torch.randn(u.shape, generator=gen, dtype=torch.float64)).requires_grad_()
    loss, parts = OperatorLoss(gamma=0.1, h=h)(pred, u, du)
    expected = relative_l2(pred, u) + math.sqrt(0.1 * h) * relative_h1_error(pred, du, h)
    torch.testing.assert_close(loss, expected)
    assert set(parts) == {"rel_l2", "rel_h1"} and not parts["rel_l2"].requires_grad
    loss.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()
    plain, parts = OperatorLoss()(pred, u)
    torch.testing.assert_close(plain, relative_l2(pred, u))
    assert set(parts) == {"rel_l2"}


def test_half_precision_prediction_is_promoted(gen):
    target = torch.randn(2, 32, 1, generator=gen)
    err = relative_l2(target.bfloat16(), target)
    assert err.dtype == torch.float32 and 0 < err.item() < 1e-2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: relative_l2(torch.zeros(2, 3), torch.zeros(2, 4)), "target: expected the shape"),
        (lambda: relative_l2(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3)), "pred"),
        (lambda: relative_l2(torch.zeros(3), torch.zeros(3)), r"pred: expected shape \(B, ...\)"),
        (lambda: relative_l2(torch.zeros(2, 3), torch.zeros(2, 3), "sum"), "reduction"),
        (lambda: relative_h1_error(torch.zeros(2, 8, 1), torch.zeros(2, 8, 1), 0.0), "h:"),
        (lambda: relative_h1_error(torch.zeros(2, 8, 1), torch.zeros(2, 8, 2), 0.1),
         "target_grad"),
        (lambda: relative_h1_error(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 1), 0.1),
         "target_grad: expected shape"),
        (lambda: relative_h1_error(torch.zeros(2, 8, 1), torch.zeros(2, 8, 1), 0.1,
                                   coeff=torch.ones(2, 8, 1)), "coeff"),
        (lambda: OperatorLoss(gamma=-1.0), "gamma"),
        (lambda: OperatorLoss(gamma=0.1), "h: expected the grid spacing"),
        (lambda: OperatorLoss(gamma=0.1, h=0.1)(torch.ones(2, 8, 1), torch.ones(2, 8, 1)),
         "target_grad: required"),
        (lambda: OperatorLoss(gamma=0.1, h=0.1, coefficient_weighted=True)(
            torch.ones(2, 8, 8, 1), torch.ones(2, 8, 8, 1), torch.ones(2, 8, 8, 2)), "coeff"),
    ],
)
def test_bad_arguments_are_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
