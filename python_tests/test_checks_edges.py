"""_checks.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""


import pytest
import torch
from test_training import _Linear1d, _PointMLP  # noqa: E402

from galerkin_ext import ops
from galerkin_ext.layers import Denormalizer, FeedForward, PointwiseRegressor
from galerkin_ext.training import evaluate


def test_a_device_neither_cpu_nor_cuda_is_refused():
    with pytest.raises(ValueError, match="^device: expected a CPU or CUDA device, got 'meta'"):
        evaluate(_PointMLP(), _Linear1d(4), device="meta")


def test_model_input_on_another_device_is_refused():
    model = PointwiseRegressor(3, 4, 2, spatial_dim=1, spatial_fc=True)
    with pytest.raises(ValueError, match=r"^x: expected a tensor on cpu like the model's "
                                         r"parameters, got one on meta"):
        model(torch.zeros(1, 4, 3, device="meta"), torch.zeros(4, 1))


def test_float32_weight_of_half_tokens_on_another_device_is_refused():
    q = torch.randn(1, 2, 4, 3, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^weight: expected a tensor on cpu like k, got one "
                                         r"on meta"):
        ops.galerkin_attention(q, q, q, weight=torch.ones(4, device="meta"))


def test_non_finite_mean_is_refused():
    with pytest.raises(ValueError, match="^mean: expected finite values"):
        Denormalizer().set_statistics(torch.tensor([float("nan")]), torch.tensor([1.0]))


@pytest.mark.parametrize("x, got", [(torch.zeros(2, 3, dtype=torch.int64), "torch.int64"),
                                    ("a", "str")])
def test_features_not_floating_are_refused(x, got):
    with pytest.raises(TypeError, match=rf"^x: expected a floating-point tensor of shape "
                                        rf"\(\.\.\., 3\), got {got}"):
        FeedForward(3, 4)(x)


def test_norm_pair_of_non_tensors_is_refused():
    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(TypeError, match=r"^k_norm\[1\]: expected a tensor, got str"):
        ops.galerkin_attention(q, q, q, k_norm=(torch.ones(2, 3), "a"))


def test_pos_not_a_tensor_is_refused():
    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(TypeError, match="^pos: expected a tensor or None, got str"):
        ops.galerkin_attention(q, q, q, pos="a")


def test_kv_reduce_without_weight_is_the_uniform_mean():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64)
    s = ops.kv_reduce(k, v, kv_pos=None, weight=None, k_map="identity", k_norm=None,
                      v_map="identity", v_norm=None, eps=1e-5, ones_column=False)
    torch.testing.assert_close(s, k.transpose(-1, -2) @ v / 5, rtol=1e-12, atol=1e-12)


def test_q_apply_s_not_a_tensor_is_refused():
    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(TypeError, match="^s: expected a tensor, got str"):
        ops.q_apply(q, "a", pos=None, q_map="identity", q_norm=None, eps=1e-5, normalizers=0)
