"""losses/relative.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import pytest
import torch

from galerkin_ext.losses import (
    MaskedRelativeLoss,
    OperatorLoss,
    RelativeLoss,
    masked_relative_l2,
    relative_h1,
    relative_h1_seminorm,
    relative_l2,
)


def test_weights_need_a_grid_axis():
    with pytest.raises(ValueError, match=r"^weight: needs pred of shape \(B, \*grid, C\) with a "
                                         r"grid axis, got \(2, 3\)"):
        relative_l2(torch.ones(2, 3), torch.ones(2, 3), weight=torch.ones(()))


def test_masked_relative_l2_checks_pred_and_weight():
    with pytest.raises(ValueError, match=r"^pred: expected shape \(B, N, C\), got \(2, 5\)"):
        masked_relative_l2(torch.ones(2, 5), torch.ones(2, 5), torch.ones(2, 5, dtype=torch.bool))
    args = (torch.ones(2, 5, 1), torch.ones(2, 5, 1), torch.ones(2, 5, dtype=torch.bool))
    for weight, got in ((torch.ones(5), r"torch.float32 \(5,\)"),
                        (torch.ones(2, 5, dtype=torch.int64), r"torch.int64 \(2, 5\)"),
                        ([1.0] * 5, r"list \(\)")):
        with pytest.raises(ValueError, match=r"^weight: expected a floating tensor of shape "
                                             r"\(2, 5\), got " + got):
            masked_relative_l2(*args, weight=weight)


def test_masked_relative_loss_takes_a_weight_only_when_weighted():
    """An unweighted loss dropped a given weight without a word; a weighted one needs it."""
    gen = torch.Generator().manual_seed(3)
    pred, target = torch.randn(2, 5, 2, generator=gen), torch.randn(2, 5, 2, generator=gen)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    weight = torch.rand(2, 5, generator=gen) + 0.1
    with pytest.raises(ValueError, match=r"^weight: a MaskedRelativeLoss\(weighted=False\) "
                                         r"takes no weight"):
        MaskedRelativeLoss()(pred, target, mask, weight=weight)
    with pytest.raises(ValueError, match=r"^weight: required by a MaskedRelativeLoss\(weighted="
                                         r"True\)"):
        MaskedRelativeLoss(weighted=True)(pred, target, mask)
    loss, _ = MaskedRelativeLoss(weighted=True)(pred, target, mask, weight=weight)
    assert loss == masked_relative_l2(pred, target, mask, weight=weight)
    assert MaskedRelativeLoss()(pred, target, mask)[0] == masked_relative_l2(pred, target, mask)


def test_relative_h1_seminorm_checks_coeff_shape_and_pred_rank():
    pred = torch.rand(2, 5, 5, 1)
    grad = torch.rand(2, 5, 5, 2)
    with pytest.raises(ValueError, match=r"^coeff: expected the shape of pred \(2, 5, 5, 1\), "
                                         r"got \(2, 5, 5\)"):
        relative_h1_seminorm(pred, grad, 0.25, coeff=torch.ones(2, 5, 5))
    with pytest.raises(ValueError, match=r"^pred: expected \(B, n, C\) in 1-D or \(B, n, n, 1\) "
                                         r"in 2-D, got \(2, 5\)"):
        relative_h1_seminorm(torch.rand(2, 5), torch.rand(2, 5), 0.25)


def test_relative_h1_needs_2d_fields():
    with pytest.raises(ValueError, match=r"^pred: expected shape \(B, s1, s2, C\) with s1, s2 "
                                         r">= 3, got \(2, 5, 1\)"):
        relative_h1(torch.rand(2, 5, 1), torch.rand(2, 5, 1), 0.25)


def test_loss_reprs_show_their_settings():
    assert repr(MaskedRelativeLoss(weighted=True)) == "MaskedRelativeLoss(weighted=True)"
    assert repr(MaskedRelativeLoss()) == "MaskedRelativeLoss(weighted=False)"
    assert repr(RelativeLoss("h1", h=0.5, periodic=True)) == (
        "RelativeLoss(norm='h1', h=0.5, weighted=False, periodic=True)")
    assert repr(RelativeLoss(weight=torch.ones(4))) == (
        "RelativeLoss(norm='l2', h=None, weighted=True, periodic=False)")
    assert repr(OperatorLoss(0.5, h=0.25)) == (
        "OperatorLoss(gamma=0.5, h=0.25, coefficient_weighted=False)")
