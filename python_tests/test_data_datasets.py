"""PyTorch datasets: layouts, subsampling, splits, normalisers, gradients, inverse problem, and
the continuum-attention sets (ODE, continuum Darcy)."""

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from galerkin_ext.data import generate as gen
from galerkin_ext.data.datasets import (
    DARCY_COARSE,
    INVERSE_COARSE,
    BurgersDataset,
    ContinuumDarcyDataset,
    DarcyDataset,
    DarcyInverseDataset,
    ODEDataset,
    UnitGaussianNormalizer,
    block_average,
    central_gradient_1d,
    central_gradient_2d,
    paired_coarse,
)
from galerkin_ext.data.storage import DataFileError, DataMismatchError, read_h5


def burgers_arrays(n=12, k=64):
    x = np.arange(k) / k
    amp = np.arange(1, n + 1)[:, None]
    return amp * np.sin(2 * np.pi * x), amp * np.cos(2 * np.pi * x)


def darcy_arrays(n=10, k=25):
    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, k)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    a = rng.choice([3.0, 12.0], size=(n, k, k))
    u = rng.random((n, 1, 1)) * (xx * (1 - xx) * yy * (1 - yy))[None]
    return a, u


def test_burgers_dataset_layout_and_split():
    a, u = burgers_arrays()
    ds = BurgersDataset((a, u), "train", 16, n_train=8, n_test=3)
    assert len(ds) == 8
    item = ds[2]
    assert {k: tuple(v.shape) for k, v in item.items()} == {
        "x": (16, 1), "grid": (16, 1), "target": (16, 1), "target_grad": (16, 1)}
    assert item["x"].dtype == torch.float32
    np.testing.assert_allclose(item["grid"][:, 0].numpy(), np.arange(16) / 16)
    np.testing.assert_allclose(item["x"][:, 0].numpy(), a[2, ::4], rtol=1e-6)
    # Periodic central difference of 3 cos(2 pi x): -3 sin(2 pi x) sin(2 pi h) / h exactly.
    h = 1 / 16
    exact = -3 * np.sin(2 * np.pi * np.arange(16) * h) * np.sin(2 * np.pi * h) / h
    np.testing.assert_allclose(item["target_grad"][:, 0].numpy(), exact, atol=1e-5)
    test = BurgersDataset((a, u), "test", 64, n_train=8, n_test=3)
    np.testing.assert_allclose(test[0]["target"][:, 0].numpy(), u[9], rtol=1e-6)
    # One scalar mean/std over every value of the training targets (population std), fitted
    # on the training samples whatever the split; a given normaliser is used as it is.
    for d, stride in ((ds, 4), (test, 1)):
        norm = d.target_normalizer
        assert norm.mean.shape == () and norm.std.shape == ()
        np.testing.assert_allclose(norm.mean.item(), u[:8, ::stride].mean(), atol=1e-12)
        np.testing.assert_allclose(norm.std.item(), u[:8, ::stride].std(), rtol=1e-5)
    given = BurgersDataset((a, u), "test", 64, n_train=8, n_test=3,
                           target_normalizer=ds.target_normalizer)
    assert given.target_normalizer.std.item() == ds.target_normalizer.std.item()
    batch = next(iter(DataLoader(ds, batch_size=4)))
    assert batch["x"].shape == (4, 16, 1)


def test_burgers_dataset_bad_arguments():
    a, u = burgers_arrays()
    # a scalar serves every resolution; another shape failed at the first decode
    with pytest.raises(ValueError, match=r"target_normalizer: fitted on samples of shape \(7,\), "
                       "expected a scalar one"):
        BurgersDataset((a, u), "train", 16, n_train=4, n_test=2,
                       target_normalizer=UnitGaussianNormalizer(torch.randn(5, 7)))
    with pytest.raises(ValueError, match="resolution must divide"):
        BurgersDataset((a, u), resolution=24, n_train=4, n_test=2)
    with pytest.raises(ValueError, match="split"):
        BurgersDataset((a, u), "valid", 16, n_train=4, n_test=2)
    with pytest.raises(ValueError, match="n_train"):
        BurgersDataset((a, u), "train", 16, n_train=40, n_test=2)
    with pytest.raises(ValueError, match="share a shape"):
        BurgersDataset((a, u[:, :8]), n_train=4, n_test=2)
    with pytest.raises(TypeError, match="source"):
        BurgersDataset(42, n_train=4, n_test=2)
    with pytest.raises(TypeError, match="dtype: expected a floating torch.dtype"):
        BurgersDataset((a, u), "train", 16, n_train=4, n_test=2, dtype=torch.int32)


def test_items_are_single_samples():
    """An int index, negative ones from the end; a slice is refused (Burgers' gave a wrong
    target_grad of shape (2, 1, 1) for ds[0:2], its x and target being right)."""
    a, u = burgers_arrays()
    (da, du) = darcy_arrays()
    for ds in (BurgersDataset((a, u), "train", 16, n_train=8, n_test=3),
               DarcyDataset((da, du), "train", 13, coarse_resolution=7, n_train=6, n_test=3),
               DarcyInverseDataset((da, du), "train", 13, coarse_resolution=7, n_train=6,
                                   n_test=3)):
        last = ds[len(ds) - 1]
        assert all(torch.equal(v, last[k]) for k, v in ds[-1].items())
        assert all(torch.equal(v, last[k]) for k, v in ds[np.int64(len(ds) - 1)].items())
        with pytest.raises(TypeError, match="i: expected an int index, got slice"):
            ds[0:2]
        with pytest.raises(TypeError, match="i: expected an int index, got bool"):
            ds[True]
        with pytest.raises(IndexError, match=f"i: {len(ds)} is out of range"):
            ds[len(ds)]


def test_darcy_dataset_bad_grids_and_dtype():
    a, u = darcy_arrays()
    for cls in (DarcyDataset, DarcyInverseDataset):
        # the attention's coarse grid finer than the data's grid is never meant
        with pytest.raises(ValueError, match="coarse_resolution: expected at most resolution"):
            cls((a, u), "train", 13, coarse_resolution=25, n_train=6, n_test=3)
        with pytest.raises(TypeError, match="dtype: expected a floating torch.dtype"):
            cls((a, u), "train", 13, coarse_resolution=7, n_train=6, n_test=3,
                dtype=torch.int64)


def test_darcy_dataset_layout_normaliser_and_gradient():
    a, u = darcy_arrays()
    ds = DarcyDataset((a, u), "train", 13, coarse_resolution=7, n_train=6, n_test=3,
                      dtype=torch.float64)
    item = ds[1]
    assert {k: tuple(v.shape) for k, v in item.items()} == {
        "x": (13, 13, 1), "coeff": (13, 13, 1), "grid": (13, 13, 2), "pos": (7, 7, 2),
        "target": (13, 13, 1), "target_grad": (13, 13, 2)}
    np.testing.assert_array_equal(item["coeff"][..., 0].numpy(), a[1, ::2, ::2])
    np.testing.assert_allclose(item["grid"][3, 5].numpy(), [0.25, 5 / 12])
    x = torch.stack([ds[i]["x"] for i in range(6)])
    np.testing.assert_allclose(x.mean(0).numpy(), 0, atol=1e-12)
    std = x.std(0, correction=0).numpy()
    assert np.all((np.abs(std - 1) < 1e-3) | (std == 0))  # std == 0 where a is constant
    back = ds.input_normalizer.decode(ds.input_normalizer.encode(ds.coeff))
    torch.testing.assert_close(back, ds.coeff)
    # Central differences of a quadratic are exact at interior nodes; the ring is zero.
    g = np.linspace(0, 1, 13)
    gx, gy = np.meshgrid(g, g, indexing="ij")
    c = u[1, 12, 12] / 0.0625  # u[1] = c x (1 - x) y (1 - y)
    exact_x = c * (1 - 2 * gx) * gy * (1 - gy)
    np.testing.assert_allclose(item["target_grad"][1:-1, 1:-1, 0].numpy(),
                               exact_x[1:-1, 1:-1], atol=1e-10)
    assert item["target_grad"][0].abs().max() == 0
    test = DarcyDataset((a, u), "test", 13, coarse_resolution=7, n_train=6, n_test=3)
    torch.testing.assert_close(test.input_normalizer.mean, ds.input_normalizer.mean.float())
    assert len(test) == 3


def test_central_gradient_2d_is_exact_for_quadratics():
    g = torch.linspace(0, 1, 9, dtype=torch.float64)
    x, y = torch.meshgrid(g, g, indexing="ij")
    grad = central_gradient_2d(x**2 + 3 * x * y, 1 / 8)
    torch.testing.assert_close(grad[1:-1, 1:-1, 0], (2 * x + 3 * y)[1:-1, 1:-1])
    torch.testing.assert_close(grad[1:-1, 1:-1, 1], (3 * x)[1:-1, 1:-1])


def test_central_gradient_2d_periodic_is_the_exact_central_difference_of_a_fourier_mode():
    # On the periodic grid x_i = 2 pi i / n, the central difference of sin(kx + my) is
    # sin(kh)/h cos(kx + ly) in x and sin(mh)/h cos(kx + my) in y, at every point (seam too).
    n, k, m = 12, 2, 3
    h = 2 * math.pi / n
    g = torch.arange(n, dtype=torch.float64) * h
    x, y = torch.meshgrid(g, g, indexing="ij")
    grad = central_gradient_2d(torch.sin(k * x + m * y)[None], h, periodic=True)[0]
    torch.testing.assert_close(grad[..., 0], math.sin(k * h) / h * torch.cos(k * x + m * y))
    torch.testing.assert_close(grad[..., 1], math.sin(m * h) / h * torch.cos(k * x + m * y))
    interior = central_gradient_2d(torch.sin(k * x + m * y), h)
    torch.testing.assert_close(interior[1:-1, 1:-1], grad[1:-1, 1:-1])
    assert interior[0].abs().max() == 0 and grad[0].abs().max() > 0


def test_central_gradient_1d_is_the_periodic_central_difference():
    n, k = 11, 3
    h = 2 * math.pi / n
    x = torch.arange(n, dtype=torch.float64) * h
    grad = central_gradient_1d(torch.sin(k * x).expand(2, n), h)
    torch.testing.assert_close(grad, (math.sin(k * h) / h * torch.cos(k * x)).expand(2, n))
    for n in (1, 2):  # both neighbours are one point: the difference would be 0 whatever u is
        with pytest.raises(ValueError, match=r"u: expected shape \(\.\.\., n\) with n >= 3"):
            central_gradient_1d(torch.rand(4, n), 0.1)
    with pytest.raises(TypeError, match="u: expected a floating-point tensor"):
        central_gradient_1d(torch.arange(5), 0.1)


def test_paired_coarse_follows_the_fine_grid():
    # --preset paper --fine 211 trained 211/43 (the preset's 141 pairing) without a word
    assert paired_coarse(211, (141, 43), DARCY_COARSE) == 61
    assert paired_coarse(211, (141, 36), INVERSE_COARSE) == 71
    assert paired_coarse(141, (141, 36), INVERSE_COARSE) == 36
    assert paired_coarse(85, (85, 22), INVERSE_COARSE) == 22  # the preset's own pairing
    with pytest.raises(ValueError, match="coarse_resolution: no default for resolution 85 "
                                         r"\(the paper pairs 141 with 36, 211 with 71\)"):
        paired_coarse(85, (141, 36), INVERSE_COARSE)


def _pooled_as_the_original(a: np.ndarray, s: int) -> np.ndarray:
    """The original's inverse-problem targets: ``a (..., K, K)`` padded with NaN to a multiple
    of ``s`` (the smaller share in front), non-overlapping ``s × s`` blocks, NaN-ignoring
    means."""
    k = a.shape[-1]
    blocks = -(-k // s)
    front = (blocks * s - k) // 2
    padded = np.full(a.shape[:-2] + (blocks * s, blocks * s), np.nan)
    padded[..., front:front + k, front:front + k] = a
    return np.nanmean(padded.reshape(a.shape[:-2] + (blocks, s, blocks, s)), axis=(-3, -1))


def test_block_average(gen):
    # the paper's pairs 141/36 and 211/71, the quick preset's 85/22, odd and even strides
    for k, nc in ((141, 36), (211, 71), (85, 22), (25, 7), (25, 5), (25, 13), (9, 9)):
        a = torch.rand(2, k, k, generator=gen, dtype=torch.float64).numpy()
        np.testing.assert_allclose(block_average(a, nc),
                                   _pooled_as_the_original(a, (k - 1) // (nc - 1)), rtol=1e-13)
        np.testing.assert_allclose(block_average(np.full((3, k, k), 7.0), nc), 7.0)
    k = 25
    g = np.linspace(0, 1, k)
    xx, yy = np.meshgrid(g, g, indexing="ij")
    lin = 2 * xx + yy
    # an odd stride's blocks are centred: a linear field is exact inside
    avg = block_average(lin, 9)
    gc = np.linspace(0, 1, 9)
    cx, cy = np.meshgrid(gc, gc, indexing="ij")
    np.testing.assert_allclose(avg[1:-1, 1:-1], (2 * cx + cy)[1:-1, 1:-1], atol=1e-12)
    step = np.where(xx < 0.5 - 1e-9, 3.0, 12.0)
    avg = block_average(step, 7)  # stride 4: the node at x = 0.5 (fine 12) averages fine 11-14
    np.testing.assert_allclose(avg[3, 3], (3 + 12 + 12 + 12) / 4)
    with pytest.raises(ValueError, match="divide"):
        block_average(lin, 6)
    # a tensor: the same average, in its dtype and differentiable (the FNO's output)
    t = torch.tensor(lin, requires_grad=True)
    torch.testing.assert_close(block_average(t, 7), torch.from_numpy(block_average(lin, 7)),
                               rtol=1e-14, atol=1e-14)
    block_average(t, 7).sum().backward()
    torch.testing.assert_close(t.grad.sum(), torch.tensor(49.0, dtype=torch.float64))
    assert block_average(t.detach().float(), 7).dtype == torch.float32


def test_inverse_dataset_noise_and_targets():
    a, u = darcy_arrays()
    clean = DarcyInverseDataset((a, u), "train", 13, coarse_resolution=7, n_train=6, n_test=3,
                                dtype=torch.float64)
    noisy = DarcyInverseDataset((a, u), "train", 13, coarse_resolution=7, n_train=6, n_test=3,
                                noise=0.1, noise_seed=3, dtype=torch.float64)
    again = DarcyInverseDataset((a, u), "train", 13, coarse_resolution=7, n_train=6, n_test=3,
                                noise=0.1, noise_seed=3, dtype=torch.float64)
    item = clean[2]
    assert {k: tuple(v.shape) for k, v in item.items()} == {
        "x": (13, 13, 1), "grid": (13, 13, 2), "pos": (7, 7, 2), "target": (7, 7, 1)}
    stride = (a.shape[-1] - 1) // 12  # the coefficient on the 13-node grid, then averaged
    np.testing.assert_allclose(item["target"][..., 0].numpy(),
                               block_average(a[2, ::stride, ::stride], 7))
    # an input on the coarse grid itself keeps the targets averaged from the fine one
    coarse_input = DarcyInverseDataset((a, u), "train", 7, coarse_resolution=7,
                                       target_resolution=13, n_train=6, n_test=3,
                                       dtype=torch.float64)
    assert coarse_input[2]["x"].shape == (7, 7, 1)
    torch.testing.assert_close(coarse_input[2]["target"], item["target"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="coarse_resolution - 1 must divide 10, got 7"):
        DarcyInverseDataset((a, u), "train", 7, coarse_resolution=7, target_resolution=11,
                            n_train=6, n_test=3)
    with pytest.raises(DataMismatchError, match="target_resolution - 1 must divide the stored "
                                                "25 - 1 intervals, got 19"):
        DarcyInverseDataset((a, u), "train", 7, coarse_resolution=7, target_resolution=19,
                            n_train=6, n_test=3)
    diff = torch.stack([noisy[i]["x"] - clean[i]["x"] for i in range(6)])
    assert abs(diff.std().item() - 0.1) < 0.01
    torch.testing.assert_close(noisy[4]["x"], again[4]["x"])  # static noise
    test = DarcyInverseDataset((a, u), "test", 13, coarse_resolution=7, n_train=6, n_test=3,
                                input_normalizer=clean.input_normalizer, noise=0.1)
    assert len(test) == 3
    # the noise follows the sample's index in the file (the test rows are samples 7-9), not its
    # row in the split (which would give the test split's row 0 training sample 0's noise)
    every = DarcyInverseDataset((a, u), "train", 13, coarse_resolution=7, n_train=10, n_test=3,
                                input_normalizer=clean.input_normalizer, noise=0.1)
    torch.testing.assert_close(test.x, every.x[7:], rtol=0, atol=0)
    with pytest.raises(TypeError, match="input_normalizer"):
        DarcyInverseDataset((a, u), "test", 13, coarse_resolution=7, n_train=6, n_test=3,
                            input_normalizer="nope")
    with pytest.raises(ValueError, match="coarse_resolution"):
        DarcyInverseDataset((a, u), "train", 13, n_train=6, n_test=3)


def test_normalizer_validation():
    with pytest.raises(ValueError, match="n_samples"):
        UnitGaussianNormalizer(torch.zeros(0, 3))
    norm = UnitGaussianNormalizer(torch.randn(5, 4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="fitted shape"):
        norm.encode(torch.zeros(4, 3))
    # an integer input was encoded and truncated back to integers; NaN data gave NaN statistics
    with pytest.raises(TypeError, match="x: expected a floating-point tensor .* got torch.int64"):
        norm.encode(torch.ones(2, 4, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="x: expected a floating-point tensor .* got ndarray"):
        norm.decode(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="x: expected a tensor on cpu, where the statistics"):
        norm.encode(torch.zeros(2, 4, 4, dtype=torch.float64, device="meta"))
    data = torch.randn(5, 3)
    data[2, 1] = float("nan")
    with pytest.raises(ValueError, match="data: expected finite values, sample 2 has NaN"):
        UnitGaussianNormalizer(data)


@pytest.mark.parametrize("scale", [1e-160, 1e160, 3e307])
def test_normalizer_statistics_at_extreme_scales(scale, gen):
    """The sums are taken on the data over its largest magnitude: squares of 1e160 overflowed
    float64 (std inf, every encoded value 0), and so did sums and differences of values near
    1e308 (mean inf, every encoded value NaN)."""
    data = torch.randn(50, 3, generator=gen, dtype=torch.float64)
    data[:, 2] = 1.0  # a constant channel keeps std 0
    norm, scaled = UnitGaussianNormalizer(data), UnitGaussianNormalizer(data * scale)
    torch.testing.assert_close(scaled.std / scale, norm.std, rtol=1e-14, atol=0)
    # a mean's rounding is on the scale of the data, not of the mean (which may be ~0)
    rounding = 1e-14 * data.abs().amax(dim=0)
    assert ((scaled.mean / scale - norm.mean).abs() <= rounding).all()
    torch.testing.assert_close(scaled.decode(scaled.encode(data * scale)), data * scale)


def test_datasets_from_generated_files(tmp_path):
    b = gen.generate_burgers(tmp_path / "b.h5", 6, 128, solve_resolution=64, n_steps=40,
                             chunk_size=3, progress=False)
    ds = BurgersDataset(b, "test", 32, n_train=4, n_test=2)
    assert ds[0]["x"].shape == (32, 1)
    d = gen.generate_darcy(tmp_path / "d.h5", 6, 25, chunk_size=3, workers=1, progress=False)
    fwd = DarcyDataset(d, "train", 13, coarse_resolution=7, n_train=4, n_test=2)
    inv = DarcyInverseDataset(d, "test", 13, coarse_resolution=5, n_train=4, n_test=2)
    assert fwd[3]["target"].abs().max() > 0 and inv[1]["target"].shape == (5, 5, 1)
    assert set(np.unique(fwd.coeff.numpy())) <= {3.0, 12.0}
    # a file of the other experiment is refused up front, naming what it holds
    with pytest.raises(DataFileError, match="holds darcy data, expected burgers data"):
        BurgersDataset(d, "train", 5, n_train=4, n_test=2)
    with pytest.raises(DataFileError, match="holds burgers data, expected darcy data"):
        DarcyInverseDataset(b, "train", 13, coarse_resolution=5, n_train=4, n_test=2)
    # arrays of the other experiment's shape, too
    # bool masks were read as 0/1 fields
    with pytest.raises(ValueError, match="variable 'a' holds bool data"):
        BurgersDataset((np.ones((6, 9)) > 0, np.zeros((6, 9))), n_train=4, n_test=2)
    with pytest.raises(ValueError, match=r"expected burgers data of shape \(B, N\)"):
        BurgersDataset((np.zeros((6, 9, 9)), np.zeros((6, 9, 9))), n_train=4, n_test=2)
    with pytest.raises(ValueError, match=r"expected darcy data of shape \(B, K, K\)"):
        DarcyDataset((np.zeros((6, 9)), np.zeros((6, 9))), n_train=4, n_test=2)
    # a truncated file: the package's error naming the file, not h5py's
    size = b.stat().st_size
    with open(b, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(DataFileError, match=r"b\.h5"):
        BurgersDataset(b, "train", 32, n_train=4, n_test=2)


def test_valid_split_of_a_separate_file_needs_the_training_normaliser():
    a, u = darcy_arrays()
    train = DarcyDataset((a, u), "train", 13, coarse_resolution=7, n_train=6, n_test=3)
    norms = {"input_normalizer": train.input_normalizer,
             "target_normalizer": train.target_normalizer}
    with pytest.raises(ValueError, match="input_normalizer must be given"):
        DarcyDataset((a[:6], u[:6]), "test", 13, coarse_resolution=7, n_train=0, n_test=3)
    # n_train = 6 says the file starts with the 6 training samples: its last 3 would be 3 of
    # them, given normalisers or not
    for given in ({}, norms):
        with pytest.raises(ValueError, match=r"n_test: .* 6 \+ 3, so the splits would overlap"):
            DarcyDataset((a[:6], u[:6]), "test", 13, coarse_resolution=7, n_train=6, n_test=3,
                         **given)
    # normalisers of another resolution were found after loading, as "x must end with ..."
    coarse = DarcyDataset((a, u), "train", 7, coarse_resolution=4, n_train=6, n_test=3)
    for name in norms:
        with pytest.raises(ValueError, match=rf"{name}: fitted on samples of shape \(7, 7\), "
                           r"expected \(13, 13\)"):
            DarcyDataset((a[:6], u[:6]), "test", 13, coarse_resolution=7, n_train=0, n_test=3,
                         **{**norms, name: getattr(coarse, name)})
    with pytest.raises(ValueError, match=r"input_normalizer: fitted on samples of shape \(7, 7\)"):
        DarcyInverseDataset((a, u), "test", 13, coarse_resolution=7, n_train=6, n_test=3,
                            input_normalizer=coarse.input_normalizer)
    test = DarcyDataset((a[:6], u[:6]), "test", 13, coarse_resolution=7, n_train=0, n_test=3,
                         **norms, dtype=torch.float64)
    assert test.input_normalizer.mean.dtype == torch.float64
    assert train.input_normalizer.mean.dtype == torch.float32  # the given one is untouched


@pytest.fixture(scope="module")
def ode_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ode")
    return {
        "l63": gen.generate_lorenz63(folder / "l63.h5", 20, dt=0.05, progress=False),
        "l63_zs": gen.generate_lorenz63(folder / "zs.h5", 5, grid="nonuniform", seed=1,
                                        progress=False),
        "cde": gen.generate_cde(folder / "cde.h5", 20, dt=0.05, progress=False),
    }


def test_ode_dataset_splits_tasks_and_normalisers(ode_files):
    split = {"n_train": 10, "n_valid": 4, "n_test": 5}
    arrays = read_h5(ode_files["l63"])
    a = ODEDataset(ode_files["l63"], "train", task="l63_a", **split)
    assert len(a) == 10 and a.grid.shape == (41, 1)
    item = a[3]
    assert {k: tuple(v.shape) for k, v in item.items()} == {
        "x": (41, 1), "grid": (41, 1), "target": (41, 2), "token0": (4,)}
    # per-component statistics over the training samples and times only
    train_out = arrays["output"][:10].reshape(-1, 2)
    np.testing.assert_allclose(a.target_normalizer.mean.numpy(), train_out.mean(0), rtol=1e-5)
    np.testing.assert_allclose(a.target_normalizer.std.numpy(), train_out.std(0), rtol=1e-5)
    np.testing.assert_allclose(a.target_normalizer.decode(item["target"]).numpy(),
                               arrays["output"][3], rtol=1e-4, atol=1e-4)
    # the token: the initial state, normalised like the fields, then t0 = 0
    np.testing.assert_allclose(item["token0"][:3].numpy(),
                               torch.cat([item["x"][0], item["target"][0]]).numpy())
    assert item["token0"][3] == 0.0
    # task (b) learns y alone, normalised by y's statistics
    b = ODEDataset(ode_files["l63"], "test", task="l63_b", **split)
    assert b[0]["target"].shape == (41, 1) and "token0" not in b[0]
    np.testing.assert_allclose(b.target_normalizer.mean.numpy(), train_out[:, :1].mean(0),
                               rtol=1e-5)
    np.testing.assert_array_equal(b.indices, np.arange(15, 20))
    valid = ODEDataset(ode_files["l63"], "valid", task="l63_b", **split)
    np.testing.assert_array_equal(valid.indices, np.arange(10, 14))
    # a zero-shot file of test samples only takes the training normalisers, on its own grid
    norms = {"input_normalizer": b.input_normalizer, "target_normalizer": b.target_normalizer}
    only = {"n_train": 0, "n_valid": 0, "n_test": 5}
    zs = ODEDataset(ode_files["l63_zs"], "test", task="l63_b", **only, **norms)
    assert zs.grid.shape == (301, 1) and torch.equal(zs.target_normalizer.mean,
                                                     b.target_normalizer.mean)
    with pytest.raises(ValueError, match="with the training set's normalisers"):
        ODEDataset(ode_files["l63_zs"], "test", task="l63_b", **only)
    # read with the training file's split sizes, its 5 samples would overlap them
    with pytest.raises(ValueError, match=r"10 \+ 4 \+ 5, so the splits would overlap"):
        ODEDataset(ode_files["l63_zs"], "test", task="l63_b", **{**split, "n_test": 5}, **norms)
    cde = ODEDataset(ode_files["cde"], "train", task="cde", **split)
    assert cde[0]["target"].shape == (41, 1)
    # task (a)'s normalisers (two target components) for task (b): named, not "x must end"
    a_norms = {"input_normalizer": a.input_normalizer, "target_normalizer": a.target_normalizer}
    with pytest.raises(ValueError, match=r"^target_normalizer: x must end with the fitted "
                       r"shape \(2,\)"):
        ODEDataset(ode_files["l63"], "test", task="l63_b", **split, **a_norms)


def test_ode_dataset_bad_arguments(ode_files):
    split = {"n_train": 10, "n_valid": 4, "n_test": 5}
    with pytest.raises(DataFileError, match="holds cde data, expected lorenz63 data"):
        ODEDataset(ode_files["cde"], "train", task="l63_b", **split)
    with pytest.raises(ValueError, match="task: expected one of"):
        ODEDataset(ode_files["cde"], "train", task="l63_c", **split)
    with pytest.raises(ValueError, match="split: expected one of"):
        ODEDataset(ode_files["cde"], "eval", task="cde", **split)
    with pytest.raises(ValueError, match="fewer than n_train \\+ n_valid \\+ n_test"):
        ODEDataset(ode_files["cde"], "train", task="cde", n_train=16, n_valid=4, n_test=5)
    with pytest.raises(FileNotFoundError, match="no such file"):
        ODEDataset(ode_files["cde"].with_name("missing.h5"), task="cde", **split)
    with pytest.raises(TypeError, match="input_normalizer"):
        ODEDataset(ode_files["cde"], "test", task="cde", **split, input_normalizer="norm")
    # the other one was fitted alone here, on the targets only
    train = ODEDataset(ode_files["cde"], "train", task="cde", **split)
    for name in ("input_normalizer", "target_normalizer"):
        other = "target" if name == "input_normalizer" else "input"
        with pytest.raises(ValueError, match=f"{other}_normalizer: expected both normalisers"):
            ODEDataset(ode_files["cde"], "test", task="cde", **split,
                       **{name: getattr(train, name)})


def test_continuum_darcy_dataset_scalar_normalisers(tmp_path):
    d = gen.generate_darcy(tmp_path / "d.h5", 8, 9, coef="lognormal", chunk_size=4, workers=1,
                           progress=False)
    arrays = read_h5(d)
    train = ContinuumDarcyDataset(d, "train", n_train=5, n_valid=1, n_test=2)
    assert train.coef == "lognormal" and train.resolution == 9
    assert {k: tuple(v.shape) for k, v in train[0].items()} == {
        "x": (9, 9, 1), "coeff": (9, 9, 1), "grid": (9, 9, 2), "target": (9, 9, 1)}
    # one global scalar each, fitted on the training samples
    assert train.input_normalizer.mean.shape == () and train.target_normalizer.std.shape == ()
    np.testing.assert_allclose(float(train.target_normalizer.mean), arrays["u"][:5].mean(),
                               rtol=1e-5)
    np.testing.assert_allclose(train[1]["coeff"][..., 0].numpy(), arrays["a"][1], rtol=1e-6)
    test = ContinuumDarcyDataset(d, "test", n_train=5, n_valid=1, n_test=2)
    np.testing.assert_array_equal(test.indices, [6, 7])
    np.testing.assert_allclose(test.target_normalizer.decode(test[0]["target"])[..., 0].numpy(),
                               arrays["u"][6], rtol=1e-4, atol=1e-7)
    ode = gen.generate_cde(tmp_path / "c.h5", 4, dt=0.5, progress=False)
    with pytest.raises(DataFileError, match="holds cde data, expected darcy data"):
        ContinuumDarcyDataset(ode, n_train=2, n_valid=1, n_test=1)


def test_subsampled_reads_keep_one_block_at_a_time(tmp_path):
    """A subsampled read keeps a copy of each block's few points: the strided views it kept
    held every 64-sample block alive at full resolution until the end (peak memory of the
    whole selection, 2.9 GB for the paper's Darcy split)."""
    import tracemalloc

    path = gen.generate_burgers(tmp_path / "b.h5", 384, 1024, solve_resolution=64, n_steps=4,
                                progress=False)
    full = 384 * 1024 * 8 * 2  # the samples' a and u at full resolution, float64
    tracemalloc.start()
    try:
        BurgersDataset(path, "train", 32, n_train=382, n_test=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < full / 2, f"peak {peak} bytes for {full} bytes of full-resolution samples"
