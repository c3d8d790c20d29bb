"""Losses and the metric (SPEC §5): exact values on constructed fields, shapes, errors."""

import math

import numpy as np
import pytest
import torch

from galerkin_ext.data.datasets import central_gradient_1d, central_gradient_2d
from galerkin_ext.losses import (
    OperatorLoss,
    RelativeLoss,
    masked_relative_l2,
    relative_h1,
    relative_h1_seminorm,
    relative_l2,
)
from galerkin_ext.quadrature import trapezoid_weights


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
    torch.testing.assert_close(relative_h1_seminorm(1.5 * u, du, h, reduction="none"),
                               torch.full((4,), 0.5, dtype=torch.float64))
    # adding a constant does not change the H^1 seminorm
    assert relative_h1_seminorm(u + 3.0, du, h).item() < 1e-12
    e = torch.randn(4, 128, 1, generator=gen, dtype=torch.float64)
    de = central_gradient_1d(e[..., 0], h)[..., None]
    expected = de.flatten(1).norm(dim=1) / du.flatten(1).norm(dim=1)
    torch.testing.assert_close(relative_h1_seminorm(u + e, du, h, reduction="none"), expected)


def test_relative_h1_2d_coefficient_weighted(gen):
    n, h = 17, 1 / 16
    u = torch.randn(3, n, n, generator=gen, dtype=torch.float64)
    du = central_gradient_2d(u, h)
    e = torch.randn(3, n, n, generator=gen, dtype=torch.float64)
    de = central_gradient_2d(e, h)
    a = torch.where(torch.rand(3, n, n, generator=gen) > 0.5, 12.0, 3.0).double()
    pred = (u + e)[..., None]
    plain = relative_h1_seminorm(pred, du, h, reduction="none")
    torch.testing.assert_close(plain, de.flatten(1).norm(dim=1) / du.flatten(1).norm(dim=1))
    weighted = relative_h1_seminorm(pred, du, h, coeff=a[..., None], reduction="none")
    num = (a[..., None] * de.square()).flatten(1).sum(1)
    den = (a[..., None] * du.square()).flatten(1).sum(1)
    torch.testing.assert_close(weighted, (num / den).sqrt())
    # a constant coefficient cancels; a varying one changes the value
    torch.testing.assert_close(relative_h1_seminorm(pred, du, h, coeff=torch.full_like(pred, 7.0),
                                                    reduction="none"), plain)
    assert not torch.allclose(weighted, plain)


def test_operator_loss_combines_terms(gen):
    u = _periodic_field(4, 64, gen)
    h = 1 / 64
    du = central_gradient_1d(u[..., 0], h)[..., None]
    pred = (u + 0.1 * torch.randn(u.shape, generator=gen, dtype=torch.float64)).requires_grad_()
    loss, parts = OperatorLoss(gamma=0.1, h=h)(pred, u, du)
    expected = relative_l2(pred, u) + math.sqrt(0.1 * h) * relative_h1_seminorm(pred, du, h)
    torch.testing.assert_close(loss, expected)
    assert set(parts) == {"rel_l2", "rel_h1"} and not parts["rel_l2"].requires_grad
    loss.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()
    plain, parts = OperatorLoss()(pred, u)
    torch.testing.assert_close(plain, relative_l2(pred, u))
    assert set(parts) == {"rel_l2"}


def test_relative_l2_median_and_quadrature_weights(gen):
    target = torch.randn(6, 40, 2, generator=gen, dtype=torch.float64)
    pred = target + 0.1 * torch.randn(6, 40, 2, generator=gen, dtype=torch.float64)
    per = relative_l2(pred, target, "none")
    # numpy's median: the mean of the two middle values for an even count
    assert relative_l2(pred, target, "median").item() == pytest.approx(
        float(per.sort().values[2:4].mean()), rel=1e-12)
    # weights over the points; the components are summed with equal weight
    t = torch.sort(torch.rand(40, generator=gen, dtype=torch.float64)).values
    w = trapezoid_weights(t)
    num = ((pred - target).square().sum(-1) * w).sum(1)
    den = (target.square().sum(-1) * w).sum(1)
    torch.testing.assert_close(relative_l2(pred, target, "none", weight=w), (num / den).sqrt())
    # a weight per sample; uniform weights give the plain norm; only ratios matter
    torch.testing.assert_close(relative_l2(pred, target, "none", weight=w.expand(6, 40)),
                               (num / den).sqrt())
    torch.testing.assert_close(relative_l2(pred, target, "none",
                                           weight=torch.full((40,), 3.0, dtype=torch.float64)),
                               per)
    # a point of zero weight does not count: the error there is invisible
    bump = pred.clone()
    bump[:, 7] += 5.0
    w0 = w.clone()
    w0[7] = 0.0
    torch.testing.assert_close(relative_l2(bump, target, "none", weight=w0),
                               relative_l2(pred, target, "none", weight=w0))


def assert_authors_h1_sum(ours, pred, target, h):
    """The authors' relative H^1 (their Lightning modules' training_step), written out on
    fields (B, s1, s2, 1): numpy's gradient (central inside, one-sided on the edges), means."""
    def norms(f):
        f = f[..., 0].numpy()
        g1, g2 = np.gradient(f, h, axis=1), np.gradient(f, h, axis=2)
        return (np.sqrt((f**2).mean(axis=(1, 2))),
                np.sqrt((g1**2 + g2**2).mean(axis=(1, 2))))
    (e0, e1), (y0, y1) = norms(pred - target), norms(target)
    np.testing.assert_allclose(ours.numpy(), (e0 + e1) / (y0 + y1), rtol=1e-12)


def test_relative_h1_full_norm_at_physical_spacing(gen):
    s = 17
    h = 1 / (s - 1)
    x = torch.linspace(0, 1, s, dtype=torch.float64)
    xx, yy = torch.meshgrid(x, x, indexing="ij")
    u = (torch.sin(math.pi * xx) * torch.sin(math.pi * yy))[None, ..., None].expand(3, s, s, 1)
    e = torch.randn(3, s, s, 1, generator=gen, dtype=torch.float64)
    de = central_gradient_2d(e[..., 0], h)
    du = central_gradient_2d(u[..., 0], h)

    def sq(f, df):
        return f.flatten(1).square().sum(1), df.flatten(1).square().sum(1)

    (e0, e1), (u0, u1) = sq(e, de), sq(u, du)
    torch.testing.assert_close(relative_h1(u + e, u, h, "none"), ((e0 + e1) / (u0 + u1)).sqrt())
    assert_authors_h1_sum(relative_h1(u + e, u, h, "none", form="sum"), u + e, u, h)
    # the spacing matters: the gradient term weighs (1/h)^2 against the L2 term
    assert not torch.allclose(relative_h1(u + e, u, h, "none"), relative_h1(u + e, u, 1.0, "none"))
    # a scaled prediction: both terms are off by the same factor
    torch.testing.assert_close(relative_h1(1.25 * u, u, h, "none"),
                               torch.full((3,), 0.25, dtype=torch.float64))


def test_relative_h1_periodic_uses_the_wrapped_differences(gen):
    n = 16
    h = 2 * math.pi / n
    u = torch.randn(3, n, n, 1, generator=gen, dtype=torch.float64)
    e = 0.1 * torch.randn(3, n, n, 1, generator=gen, dtype=torch.float64)
    de = central_gradient_2d(e[..., 0], h, periodic=True)
    du = central_gradient_2d(u[..., 0], h, periodic=True)
    expected = ((e.flatten(1).square().sum(1) + de.flatten(1).square().sum(1))
                / (u.flatten(1).square().sum(1) + du.flatten(1).square().sum(1))).sqrt()
    torch.testing.assert_close(relative_h1(u + e, u, h, "none", periodic=True), expected)
    assert not torch.allclose(relative_h1(u + e, u, h, "none"), expected)
    # a field shifted around the torus has the same periodic error, not the same interior one
    shifted = relative_h1((u + e).roll(5, 1), u.roll(5, 1), h, "none", periodic=True)
    torch.testing.assert_close(shifted, expected)
    loss, _ = RelativeLoss("h1", h=h, periodic=True)(u + e, u)
    torch.testing.assert_close(loss, expected.mean())
    with pytest.raises(TypeError, match="periodic"):
        RelativeLoss("h1", h=h, periodic="yes")


def test_relative_loss(gen):
    target = torch.randn(4, 9, 9, 1, generator=gen, dtype=torch.float64)
    # (an offset, which has no gradient, keeps the two errors apart: with white noise alone
    # they agreed to 2e-5 in one of the fresh draws)
    pred = target + 0.1 * torch.randn(4, 9, 9, 1, generator=gen, dtype=torch.float64) + 0.3
    pred.requires_grad_()
    loss, parts = RelativeLoss("h1", h=0.125)(pred, target, None, None)
    torch.testing.assert_close(loss, relative_h1(pred, target, 0.125))
    assert set(parts) == {"rel_l2", "rel_h1"} and not parts["rel_h1"].requires_grad
    # the parts are the L2 error beside the loss, not the loss again
    l2 = relative_l2(pred.detach(), target)
    torch.testing.assert_close(parts["rel_l2"], l2)
    torch.testing.assert_close(parts["rel_h1"], loss.detach())
    assert abs(float(parts["rel_l2"] - parts["rel_h1"])) > 1e-3
    loss.backward()
    assert torch.isfinite(pred.grad).all()
    code, code_parts = RelativeLoss("h1-code")(pred, target)
    torch.testing.assert_close(code, relative_h1(pred, target, 1.0, form="sum"))
    torch.testing.assert_close(code_parts["rel_l2"], l2)
    torch.testing.assert_close(code_parts["rel_h1"], code.detach())
    assert_authors_h1_sum(relative_h1(pred.detach(), target, 1.0, "none", form="sum"),
                          pred.detach(), target, 1.0)
    # the authors' differences are never periodic: asked for, they are refused
    with pytest.raises(ValueError, match="periodic: 'h1-code' is the authors' loss"):
        RelativeLoss("h1-code", periodic=True)
    with pytest.raises(ValueError, match="periodic: the 'sum' form is the authors' code"):
        relative_h1(pred, target, 1.0, form="sum", periodic=True)
    w = trapezoid_weights(torch.linspace(0, 1, 9, dtype=torch.float64))
    l2, parts = RelativeLoss("l2", weight=w)(pred[..., 0, :], target[..., 0, :])
    torch.testing.assert_close(l2, relative_l2(pred[..., 0, :], target[..., 0, :], weight=w))
    assert set(parts) == {"rel_l2"}
    # the weights move with the loss (a buffer) and stay out of its state_dict
    loss_fn = RelativeLoss("l2", weight=w.float())
    assert loss_fn.double().weight.dtype == torch.float64 and not loss_fn.state_dict()
    with pytest.raises(ValueError, match="weight: expected finite, non-negative"):
        RelativeLoss("l2", weight=-w)


# Scales whose squares underflow or overflow the dtype, though the values and ratios do not.
_EXTREME_SCALES = [(torch.float32, 1e-24), (torch.float32, 1e19), (torch.float64, 1e-162),
                   (torch.float64, 1e155)]


@pytest.mark.parametrize(("dtype", "scale"), _EXTREME_SCALES, ids=str)
def test_relative_errors_at_extreme_scales(dtype, scale, gen):
    """Relative errors are scale-free: each equals its value at scale 1, computed in float64
    (the sums of squares were taken as they are: 0/0, inf/inf or 47 % off)."""
    n, h = 9, 1 / 8
    pred, target = (torch.randn(3, n, n, 1, generator=gen, dtype=torch.float64)
                    for _ in range(2))
    grad = central_gradient_2d(target[..., 0], h)
    mask = torch.ones(3, n * n, dtype=torch.bool)
    mask[0, :5] = False
    weight = torch.rand(n, n, generator=gen, dtype=torch.float64) + 0.1
    calls = [
        lambda p, t, g: relative_l2(p, t, "none"),
        lambda p, t, g: relative_l2(p, t, "none", weight=weight.to(p.dtype)),
        lambda p, t, g: masked_relative_l2(p.flatten(1, 2), t.flatten(1, 2), mask,
                                           reduction="none"),
        lambda p, t, g: relative_h1_seminorm(p, g, h, reduction="none"),
        lambda p, t, g: relative_h1(p, t, h, reduction="none"),
        lambda p, t, g: relative_h1(p, t, h, reduction="none", form="sum"),
    ]
    for call in calls:
        expected = call(pred, target, grad)
        got = call(*((x * scale).to(dtype) for x in (pred, target, grad)))
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize(("pred_scale", "target_scale"), [(1e20, 1.0), (1.0, 1e-20)], ids=str)
def test_relative_errors_beyond_the_squares_of_float32(pred_scale, target_scale, gen):
    """A relative error of 1e20 is a float32 number, though its squares are not: each of the
    difference and the target is scaled by its own largest magnitude (scaled by the target's,
    the difference's squares overflowed to inf)."""
    n, h = 9, 1 / 8
    pred, target = (torch.randn(3, n, n, 1, generator=gen, dtype=torch.float64)
                    for _ in range(2))
    pred, target = pred * pred_scale, target * target_scale
    grad = central_gradient_2d(target[..., 0], h)
    mask = torch.ones(3, n * n, dtype=torch.bool)
    weight = torch.rand(n, n, generator=gen, dtype=torch.float64) + 0.1
    coeff = torch.rand(3, n, n, 1, generator=gen, dtype=torch.float64) + 0.5
    calls = [
        lambda p, t, g: relative_l2(p, t, "none"),
        lambda p, t, g: relative_l2(p, t, "none", weight=weight.to(p.dtype)),
        lambda p, t, g: masked_relative_l2(p.flatten(1, 2), t.flatten(1, 2), mask,
                                           reduction="none"),
        lambda p, t, g: relative_h1_seminorm(p, g, h, coeff.to(p.dtype), reduction="none"),
        lambda p, t, g: relative_h1(p, t, h, reduction="none"),
        lambda p, t, g: relative_h1(p, t, h, reduction="none", form="sum"),
    ]
    for call in calls:
        expected = call(pred, target, grad)  # (float64: the squares are representable)
        assert bool(expected.min() > 1e18)
        got = call(pred.float(), target.float(), grad.float())
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=0)


def test_an_infinite_prediction_gives_an_infinite_error_and_nan_stays_nan():
    """Each scaled by its own largest magnitude, an infinite difference gave inf / inf = NaN."""
    target = torch.ones(2, 4, 1)
    pred = target.clone()
    pred[0, 1], pred[1, 2] = math.inf, math.nan
    got = relative_l2(pred, target, "none")
    assert math.isinf(got[0]) and math.isnan(got[1])
    mask = torch.ones(2, 4, dtype=torch.bool)
    got = masked_relative_l2(pred, target, mask, reduction="none")[:, 0]
    assert math.isinf(got[0]) and math.isnan(got[1])


def test_relative_l2_scale_ignores_points_that_do_not_count():
    """The per-sample scale comes from the points with weight > 0 (and valid ones): a value of
    1e15 at a weight-0 point shrank the others' squares to 0 (NaN)."""
    target = 1e-10 * torch.arange(1.0, 7.0).view(1, 6, 1)
    pred = 1.1 * target
    target[0, 0], pred[0, 0] = 1e15, 1e15
    weight = torch.tensor([0.0, 1, 1, 1, 1, 1])
    torch.testing.assert_close(relative_l2(pred, target, "none", weight=weight),
                               torch.tensor([0.1]))
    torch.testing.assert_close(masked_relative_l2(pred, target, torch.ones(1, 6, dtype=torch.bool),
                                                  weight=weight[None], reduction="none"),
                               torch.tensor([[0.1]]))


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
        (lambda: relative_l2(torch.ones(2, 5, 1), torch.ones(2, 5, 1), weight=torch.ones(4)),
         r"weight: expected shape \(5,\) or \(2, 5\)"),
        (lambda: relative_l2(torch.ones(2, 5, 1), torch.ones(2, 5, 1),
                             weight=-torch.ones(5)), "weight: expected finite, non-negative"),
        (lambda: relative_l2(torch.ones(2, 5, 1), torch.ones(2, 5, 1), weight=[1.0] * 5),
         "weight: expected a floating-point tensor"),
        (lambda: relative_h1(torch.ones(2, 5, 1), torch.ones(2, 5, 1), 0.1),
         r"pred: expected shape \(B, s1, s2, C\)"),
        (lambda: relative_h1(torch.ones(2, 5, 5, 1), torch.ones(2, 5, 5, 1), -1.0), "h:"),
        (lambda: relative_h1(torch.ones(2, 5, 5, 1), torch.ones(2, 5, 5, 1), 0.1, form="x"),
         "form"),
        (lambda: RelativeLoss("h2"), "norm: expected one of"),
        (lambda: RelativeLoss("h1"), "h: expected a finite float"),
        (lambda: RelativeLoss("h1", h=0.1, weight=torch.ones(3)), "weight: quadrature weights"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 1), torch.zeros(2, 8, 1), 0.0), "h:"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 1), torch.zeros(2, 8, 2), 0.1),
         "target_grad"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 1), 0.1),
         "target_grad: expected shape"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 1), torch.zeros(2, 8, 1), 0.1,
                                      coeff=torch.ones(2, 8, 1)), "coeff"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 2), 0.1,
                                      coeff=torch.linspace(-1, 1, 128).reshape(2, 8, 8, 1)),
         "coeff: expected finite, non-negative coefficient values"),
        # NaN, inf or a zero coefficient made the ratio NaN, without a word
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 2), 0.1,
                                      coeff=torch.full((2, 8, 8, 1), torch.nan)),
         "coeff: expected finite, non-negative"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 2), 0.1,
                                      coeff=torch.full((2, 8, 8, 1), torch.inf)),
         "coeff: expected finite, non-negative"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 2), 0.1,
                                      coeff=torch.cat([torch.ones(1, 8, 8, 1),
                                                    torch.zeros(1, 8, 8, 1)])),
         "coeff: sample 1 has no positive value"),
        # positive on the boundary ring only, where the differences are 0: NaN for every sample
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 8, 1), torch.zeros(2, 8, 8, 2), 0.1,
                                      coeff=torch.nn.functional.pad(torch.zeros(2, 6, 6, 1),
                                                                 (0, 0, 1, 1, 1, 1), value=1.0)),
         "coeff: sample 0 has no positive value at an interior node"),
        # an empty grid gave NaN; the operands on two devices, torch's own message
        (lambda: relative_l2(torch.ones(2, 0, 1), torch.ones(2, 0, 1)),
         r"pred: expected shape \(B, ...\) .* none empty"),
        (lambda: relative_l2(torch.ones(2, 5, 1), torch.ones(2, 5, 1, device="meta")),
         "target: expected a tensor on cpu like pred, got one on meta"),
        (lambda: relative_h1_seminorm(torch.zeros(2, 8, 1), torch.zeros(2, 8, 1, device="meta"),
                                      0.1), "target_grad: expected a tensor on cpu like pred"),
        (lambda: masked_relative_l2(torch.ones(2, 3, 1), torch.ones(2, 3, 1, device="meta"),
                                    torch.ones(2, 3, dtype=torch.bool)),
         "target: expected a tensor on cpu like pred"),
        (lambda: RelativeLoss("l2", weight=torch.ones(5, dtype=torch.int64)),
         "weight: expected a floating-point tensor or None, got torch.int64"),
        # n = 1 or 2: the periodic difference is 0, so the error was 1 whatever pred was
        (lambda: relative_h1_seminorm(torch.randn(3, 2, 1), torch.randn(3, 2, 1), 0.5),
         r"pred: expected shape \(B, n, C\) with n >= 3 in 1-D"),
        # a sample without weight had NaN errors, named nowhere
        (lambda: relative_l2(torch.ones(2, 5, 1), torch.ones(2, 5, 1), weight=torch.zeros(5)),
         "weight: sample 0 has no positive weight"),
        (lambda: relative_l2(torch.ones(2, 5, 1), torch.ones(2, 5, 1),
                             weight=torch.tensor([[1.0] * 5, [0.0] * 5])),
         "weight: sample 1 has no positive weight"),
        (lambda: masked_relative_l2(torch.ones(2, 3, 1), torch.ones(2, 3, 1),
                                    torch.tensor([[True, True, False]] * 2),
                                    weight=torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 5.0]])),
         "weight: sample 1 has no positive weight"),
        (lambda: RelativeLoss("l2", h="abc"), "h: expected a finite float"),
        (lambda: RelativeLoss("l2", weight=torch.zeros(5)), "weight: expected some positive"),
        (lambda: RelativeLoss("h1-code", h=True), "h: expected a finite float"),
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


def test_numpy_and_python_scalars_alike():
    """A spacing or weight from numpy (np.float32 included) is a float like any other."""
    pred, target = torch.rand(2, 5, 5, 1), torch.rand(2, 5, 5, 1)
    for h in (0.25, np.float32(0.25), np.float64(0.25)):
        torch.testing.assert_close(relative_h1(pred, target, h), relative_h1(pred, target, 0.25))
    loss = OperatorLoss(gamma=np.float32(0.5), h=np.float32(0.25))
    assert (loss.gamma, loss.h) == (0.5, 0.25)


def test_an_exact_prediction_has_a_zero_gradient_not_nan():
    """Where a sample's (or a channel's, or a gradient term's) error is exactly 0, the losses
    take the norm's subgradient 0: sqrt's infinite slope there made NaN gradients, which the
    batch mean spread to every sample (the Trainer then stopped on a 'nan gradient norm')."""
    torch.manual_seed(0)
    target = torch.randn(2, 8, 8, 1, dtype=torch.float64)
    shifted = target.clone()
    shifted[1] += 0.1 * torch.randn(8, 8, 1, dtype=torch.float64)  # sample 0 exact
    grad = central_gradient_2d(target[..., 0], 1 / 7)
    losses = {
        "relative_l2": lambda p: relative_l2(p, target),
        "masked_relative_l2": lambda p: masked_relative_l2(
            p.flatten(1, 2), target.flatten(1, 2), torch.ones(2, 64, dtype=torch.bool)),
        "relative_h1_seminorm": lambda p: relative_h1_seminorm(p, grad, 1 / 7),
        "relative_h1": lambda p: relative_h1(p, target, 1 / 7),
        "relative_h1 sum": lambda p: relative_h1(p, target, 1.0, form="sum"),
        "OperatorLoss": lambda p: OperatorLoss(0.5, 1 / 7)(p, target, grad)[0],
    }
    for name, loss in losses.items():
        pred = shifted.clone().requires_grad_()
        loss(pred).backward()
        assert torch.isfinite(pred.grad).all(), name
        assert torch.equal(pred.grad[0], torch.zeros_like(pred.grad[0])), name
        assert pred.grad[1].abs().sum() > 0, name
    # a constant shift: its gradient term is 0, the L2 term is not (the 'sum' form's NaN)
    pred = (target + 0.5).requires_grad_()
    relative_h1(pred, target, 1.0, form="sum").backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0
    # 0 / 0 is no relative error: it stays NaN
    assert relative_l2(torch.zeros(1, 4, 1), torch.zeros(1, 4, 1)).isnan()
