"""data/datasets.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_data_datasets import burgers_arrays, darcy_arrays  # noqa: E402

from galerkin_ext.data import generate as gen
from galerkin_ext.data.datasets import (
    BurgersDataset,
    ContinuumDarcyDataset,
    DarcyDataset,
    DarcyInverseDataset,
    ODEDataset,
    UnitGaussianNormalizer,
    block_average,
    central_gradient_1d,
    central_gradient_2d,
)
from galerkin_ext.data.storage import DataFileError


@pytest.fixture(scope="module")
def l63(tmp_path_factory):
    return gen.generate_lorenz63(tmp_path_factory.mktemp("l63") / "l63.h5", 6, dt=0.05,
                                 progress=False)


def test_normalizer_refuses_another_correction():
    for bad in (2, True, 0.5):
        with pytest.raises(ValueError, match=r"^correction: expected 0 \(population std\) or 1"):
            UnitGaussianNormalizer(torch.randn(4, 3), correction=bad)


def test_normalizer_called_encodes():
    data = torch.randn(5, 3, dtype=torch.float64) * 4 + 2
    norm = UnitGaussianNormalizer(data)
    x = torch.randn(2, 3, dtype=torch.float64)
    ref = (x - data.mean(0)) / (data.std(0, correction=0) + 1e-5)
    torch.testing.assert_close(norm(x), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(norm(x), norm.encode(x), rtol=0, atol=0)


@pytest.mark.parametrize("block", [1, 7, 40, 1 << 21])
def test_normalizer_statistics_are_taken_a_block_of_samples_at_a_time(block, monkeypatch):
    """The statistics are summed over blocks of samples (float64 copies of the whole set took
    4.7 times its size): any block size gives the float64 mean and std of the whole set, a
    constant entry exactly its value and std 0, and a non-finite value names its sample."""
    import galerkin_ext.data.datasets as datasets

    monkeypatch.setattr(datasets, "_STATISTICS_BLOCK", block)
    gen = torch.Generator().manual_seed(7)
    data = torch.randn(13, 3, 5, generator=gen, dtype=torch.float64) * 3 + 1e3
    data[:, 1, 2] = -2.5
    noncontiguous = data.to(torch.float32).transpose(1, 2)  # (13, 5, 3), strided
    for fitted, correction in ((data, 0), (noncontiguous, 1)):
        norm = UnitGaussianNormalizer(fitted, correction=correction)
        ref = fitted.double()
        torch.testing.assert_close(norm.mean, ref.mean(0), rtol=1e-15, atol=0)
        torch.testing.assert_close(norm.std, ref.std(0, correction=correction), rtol=1e-12,
                                   atol=0)
    norm = UnitGaussianNormalizer(data.clone().requires_grad_())  # fitted on the values only
    assert norm.mean[1, 2] == -2.5 and norm.std[1, 2] == 0 and not norm.mean.requires_grad
    one = UnitGaussianNormalizer(data[:1])
    assert torch.equal(one.mean, data[0]) and not one.std.any()
    data[11, 2, 4] = float("-inf")
    with pytest.raises(ValueError, match="data: expected finite values, sample 11 has NaN"):
        UnitGaussianNormalizer(data)


_FIT_MEMORY = """
import resource, numpy as np, torch
from galerkin_ext.data import UnitGaussianNormalizer
data = np.empty((200, 211, 211), np.float32)  # 36 MB, filled in place (no float64 draft)
for i, sample in enumerate(data):
    sample[:] = i % 5
UnitGaussianNormalizer(data[:1])  # torch's own first-use allocations, outside the measure
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
UnitGaussianNormalizer(data)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / data.nbytes)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="ru_maxrss in KiB (Linux)")
def test_fitting_a_normalizer_takes_a_bounded_memory():
    """A fit took float64 copies of the whole set: 4.7 times the size of float32 data on top of
    it (200 samples at 421², 135 MiB, took 641 MiB more; the blocks take 32 MiB there, and about
    0.8 times the 36 MB here)."""
    out = subprocess.run([sys.executable, "-c", _FIT_MEMORY], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    extra = float(out.stdout)
    assert extra < 1.5, f"the fit took {extra:.1f} times the data's size"


def test_central_gradients_check_their_arguments():
    with pytest.raises(TypeError, match=r"^u: expected a tensor of shape \(\.\.\., n\), got list"):
        central_gradient_1d([1.0, 2.0, 3.0], 0.1)
    with pytest.raises(TypeError, match=r"^u: expected a tensor of shape \(\.\.\., n, n\), got "
                                        r"ndarray"):
        central_gradient_2d(np.zeros((3, 3)), 0.1)
    for shape in ((5,), (2, 5), (5, 2)):
        with pytest.raises(ValueError, match=r"^u: expected shape \(\.\.\., n1, n2\) with n1, "
                                             r"n2 >= 3, got"):
            central_gradient_2d(torch.zeros(shape), 0.1)
    with pytest.raises(TypeError, match="^u: expected a floating-point tensor, got torch.int64"):
        central_gradient_2d(torch.zeros(4, 4, dtype=torch.int64), 0.1)


def test_block_average_needs_square_fields():
    for shape in ((5,), (5, 4)):
        with pytest.raises(ValueError, match=r"a must have shape \(\.\.\., K, K\)"):
            block_average(np.zeros(shape), 3)


def test_block_average_of_an_integer_tensor_is_refused():
    """An integer tensor's block means in its own dtype truncated (3 and 12 gave 0); an integer
    array is averaged in float64, as before."""
    field = [[3, 3, 12, 12, 12]] * 5
    with pytest.raises(TypeError, match="^a: expected a floating-point tensor, got torch.int64"):
        block_average(torch.tensor(field), 3)
    np.testing.assert_array_equal(block_average(np.array(field), 3), [[3.0, 12.0, 12.0]] * 3)


def test_a_source_that_is_neither_a_pair_nor_a_known_file_is_refused(tmp_path):
    a, u = burgers_arrays()
    with pytest.raises(ValueError, match=r"^source must be a path or a pair \(a, u\) of arrays$"):
        BurgersDataset((a, u, u), resolution=16, n_train=4, n_test=2)
    with pytest.raises(FileNotFoundError, match="^source: no such file"):
        BurgersDataset(tmp_path / "none.h5", resolution=16, n_train=4, n_test=2)
    (tmp_path / "data.npz").write_bytes(b"not data")
    with pytest.raises(DataFileError, match="is neither a galerkin_ext .h5 file nor a .mat file"):
        DarcyDataset(tmp_path / "data.npz", n_train=4, n_test=2)


def test_the_train_split_needs_training_samples():
    a, u = burgers_arrays()
    with pytest.raises(ValueError, match=r"^n_train: expected >= 1 for the 'train' split, got 0"):
        BurgersDataset((a, u), "train", resolution=16, n_train=0, n_test=2)


def test_pointwise_normalisers_need_two_training_samples():
    """One sample's pointwise std is 0: the training inputs were all 0 and the test inputs
    (x - mean) / eps, up to 9e5, without a word (the scalar Burgers normaliser is fine)."""
    a, u = darcy_arrays(n=10, k=25)
    split = {"n_train": 1, "n_test": 2, "resolution": 13, "coarse_resolution": 7}
    for make in (DarcyDataset, DarcyInverseDataset):
        with pytest.raises(ValueError, match=r"^n_train: fitting the pointwise "
                                             r"input_normalizer needs >= 2 training samples, "
                                             "got 1$"):
            make((a, u), "test", **split)
    given = DarcyDataset((a, u), "train", **{**split, "n_train": 2})
    test = DarcyDataset((a, u), "test", **split, input_normalizer=given.input_normalizer,
                        target_normalizer=given.target_normalizer)  # given: any n_train
    assert len(test) == 2
    a, u = burgers_arrays()
    assert len(BurgersDataset((a, u), "train", resolution=16, n_train=1, n_test=2)) == 1


def test_darcy_fits_the_normaliser_it_is_not_given():
    a, u = darcy_arrays(n=10, k=25)
    split = {"n_train": 6, "n_test": 2, "resolution": 13, "coarse_resolution": 7,
             "dtype": torch.float64}
    train = DarcyDataset((a, u), "train", **split)
    given_in = UnitGaussianNormalizer(torch.full((2, 13, 13), 5.0), eps=1.0)  # mean 5, std 1
    test = DarcyDataset((a, u), "test", **split, input_normalizer=given_in)
    torch.testing.assert_close(test.input_normalizer.mean, given_in.mean)
    torch.testing.assert_close(test.x, (test.coeff - 5.0) / 1.0)
    torch.testing.assert_close(test.target_normalizer.mean, train.target_normalizer.mean)
    torch.testing.assert_close(test.target_normalizer.std, train.target_normalizer.std)
    given_t = UnitGaussianNormalizer(torch.zeros(2, 13, 13), eps=2.0)
    test = DarcyDataset((a, u), "test", **split, target_normalizer=given_t)
    torch.testing.assert_close(test.target_normalizer.std + test.target_normalizer.eps,
                               torch.full((13, 13), 2.0, dtype=torch.float64))
    torch.testing.assert_close(test.input_normalizer.mean, train.input_normalizer.mean)
    torch.testing.assert_close(test.x, train.input_normalizer.encode(test.coeff))


def test_the_valid_split_needs_validation_samples(l63):
    with pytest.raises(ValueError, match=r"^n_valid: expected >= 1 for the 'valid' split, got 0"):
        ODEDataset(l63, "valid", task="l63_b", n_train=3, n_valid=0, n_test=2)


def test_generated_sets_need_a_path():
    with pytest.raises(TypeError, match=r"^source: expected the path of a generated \.h5 file, "
                                        r"got tuple"):
        ContinuumDarcyDataset(darcy_arrays(), "train", n_train=5, n_valid=1, n_test=2)


def test_an_incomplete_generated_file_is_refused(l63, tmp_path):
    part = tmp_path / "part.h5"
    shutil.copy(l63, part)
    with h5py.File(part, "r+") as f:
        f.attrs["complete"] = False
        f["completed"][0] = False
    with pytest.raises(DataFileError, match=r"is incomplete \(0 of 6 samples\); finish it with "
                                            r"resume"):
        ODEDataset(part, "train", task="l63_b", n_train=3, n_valid=1, n_test=2)
