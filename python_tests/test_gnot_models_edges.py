"""models/gnot.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import pytest
import torch
import torch.nn.functional as F

from galerkin_ext.models import GNOT, MIONet


def test_input_weights_of_the_wrong_length_are_refused():
    model = GNOT(2, 2, [3], 1, n_hidden=8, n_layers=1)
    with pytest.raises(ValueError, match=r"^input_weights: expected None or a list of 1 weights"):
        model(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], input_weights=[None, None])
    with pytest.raises(ValueError, match=r"^input_weights: expected None or a list of 1 weights"):
        model(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], input_weights=torch.rand(1, 4))


def test_a_theta_of_the_wrong_shape_is_refused():
    model = GNOT(2, 2, [3], 1, theta_dim=4, n_hidden=8, n_layers=1)
    with pytest.raises(ValueError, match=r"theta: expected shape \(B, theta_dim\) = \(1, 4\), "
                                         r"got \(1, 3\)"):
        model(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], torch.rand(1, 3))


def test_given_expert_probabilities_of_the_wrong_shape_are_refused():
    model = GNOT(2, 2, [3], 1, n_hidden=8, n_layers=1, n_experts=3, gate="given")
    with pytest.raises(ValueError, match=r"expert_probs: expected shape \(1, 5, 3\), "
                                         r"got \(1, 5, 2\)"):
        model(torch.rand(1, 5, 2), [torch.rand(1, 4, 3)], expert_probs=torch.rand(1, 5, 2))


@pytest.mark.parametrize("dims, points", [([3, 2], [4]), ((3,), 4), (3, [4])])
def test_mionet_needs_one_input_points_entry_per_input(dims, points):
    with pytest.raises(ValueError, match="^input_dims, input_points: expected two lists of one "
                                         "entry per input function"):
        MIONet(2, 2, dims, points, 1)


def _gelu_mlp(net: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The Linear layers of ``net`` with GELU between them (SPEC-gnot §6), from their weights."""
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    for i, linear in enumerate(linears):
        h = h @ linear.weight.T + linear.bias
        h = F.gelu(h) if i < len(linears) - 1 else h
    return h


def test_mionet_without_theta_or_input_weights_matches_its_formula():
    """u_c(y) = Σ_k T_kc(y) Π_l B^l_kc + β_c, each branch of its zero-padded flattened input."""
    torch.manual_seed(0)
    model = MIONet(2, 2, [3, 2], [5, 4], 2, width=8, latent=3, n_layers=3).double()
    torch.nn.init.normal_(model.bias)
    x = torch.rand(2, 6, 2, dtype=torch.float64)
    ys = [torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(2, 3, 2, dtype=torch.float64)]
    out = model(x, ys)
    padded = [ys[0].flatten(1), torch.cat([ys[1], torch.zeros(2, 1, 2, dtype=torch.float64)],
                                          1).flatten(1)]
    b = _gelu_mlp(model.branches[0], padded[0]) * _gelu_mlp(model.branches[1], padded[1])
    t = F.gelu(_gelu_mlp(model.trunk, x)).view(2, 6, 3, 2)  # the trunk's output activated
    ref = (t * b.view(2, 1, 3, 2)).sum(2) + model.bias
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_a_theta_branch_is_the_last_input_of_every_block():
    """theta_mode="branch": θ is the input after the input functions, so with the last value
    projection of every block's cross-attention zeroed the output no longer depends on θ
    (and it does before)."""
    torch.manual_seed(0)
    model = GNOT(2, 2, (3,), 1, theta_dim=2, n_hidden=16, n_layers=2, theta_mode="branch").eval()
    x, f = torch.rand(1, 5, 2), torch.rand(1, 4, 3)
    zero, one = torch.zeros(1, 2), torch.ones(1, 2)
    with torch.no_grad():
        assert (model(x, [f], zero) - model(x, [f], one)).abs().max() > 1e-4
        for block in model.blocks:
            block.cross.values[-1].weight.zero_()
            block.cross.values[-1].bias.zero_()
        torch.testing.assert_close(model(x, [f], zero), model(x, [f], one), rtol=0, atol=1e-6)


def test_the_activation_reaches_every_part_of_gnot():
    """act="relu": ReLU and no GELU in the trunk, the branches (θ's too), the blocks, the gates
    and the decoder."""
    model = GNOT(2, 2, (3,), 1, theta_dim=2, n_hidden=8, n_layers=2, n_experts=2, act="relu",
                 theta_mode="branch")
    for part in (model.trunk, model.branches, model.theta_branch, model.blocks, model.gates,
                 model.decoder):
        kinds = {type(m) for m in part.modules()}
        assert torch.nn.ReLU in kinds
        assert torch.nn.GELU not in kinds
