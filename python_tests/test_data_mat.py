"""Original .mat files: MATLAB v5 (scipy) and v7.3 (HDF5) round trips, and datasets on them."""

from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
import torch

from galerkin_ext.data import datasets
from galerkin_ext.data.datasets import BurgersDataset, DarcyDataset, DarcyInverseDataset
from galerkin_ext.data.mat import is_mat_v73, load_mat, read_burgers_mat, read_darcy_mat
from galerkin_ext.data.storage import DataFileError


def write_v73(path, **arrays):
    """Write like MATLAB -v7.3: HDF5 with a 512-byte user block, column-major (reversed) axes."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=np.asarray(value).transpose())
    with open(path, "r+b") as fh:
        fh.write(b"MATLAB 7.3 MAT-file".ljust(128, b" "))


@pytest.fixture
def darcy_arrays():
    rng = np.random.default_rng(0)
    return rng.choice([3.0, 12.0], size=(6, 9, 9)), rng.random((6, 9, 9))


def test_v5_round_trip(tmp_path, darcy_arrays):
    rng = np.random.default_rng(1)
    a, u = rng.random((5, 16)), rng.random((5, 16))
    scipy.io.savemat(tmp_path / "b.mat", {"a": a, "u": u})
    assert not is_mat_v73(tmp_path / "b.mat")
    ra, ru = read_burgers_mat(tmp_path / "b.mat")
    np.testing.assert_array_equal(ra, a)
    np.testing.assert_array_equal(ru, u)
    coeff, sol = darcy_arrays
    scipy.io.savemat(tmp_path / "d.mat", {"coeff": coeff, "sol": sol, "Kcoeff": coeff})
    rc, rs = read_darcy_mat(tmp_path / "d.mat")
    np.testing.assert_array_equal(rc, coeff)
    np.testing.assert_array_equal(rs, sol)


def test_v73_round_trip(tmp_path, darcy_arrays):
    coeff, sol = darcy_arrays
    write_v73(tmp_path / "d.mat", coeff=coeff, sol=sol)
    assert is_mat_v73(tmp_path / "d.mat")
    rc, rs = read_darcy_mat(tmp_path / "d.mat")
    assert rc.shape == (6, 9, 9)
    np.testing.assert_array_equal(rc, coeff)
    np.testing.assert_array_equal(rs, sol)
    a = np.arange(12.0).reshape(3, 4)
    write_v73(tmp_path / "b.mat", a=a, u=2 * a)
    ra, ru = read_burgers_mat(tmp_path / "b.mat")
    np.testing.assert_array_equal(ra, a)
    np.testing.assert_array_equal(ru, 2 * a)


def test_darcy_fields_on_a_non_square_grid_are_refused(tmp_path):
    """read_darcy_mat promises (B, K, K): coeff and sol of equal shape but a K1 x K2 grid
    (K1 != K2) are refused, naming the file; without the check a rectangular field would be
    returned as if it were the square grid the docstring promises, with no error."""
    write_v73(tmp_path / "r.mat", coeff=np.ones((2, 4, 5)), sol=np.ones((2, 4, 5)))
    with pytest.raises(ValueError, match=r"r\.mat: expected coeff and sol of equal shape "
                                         r"\(B, K, K\) with B >= 1, got \(2, 4, 5\), "
                                         r"\(2, 4, 5\)"):
        read_darcy_mat(tmp_path / "r.mat")
    write_v73(tmp_path / "s.mat", coeff=np.ones((2, 5, 5)), sol=np.ones((2, 5, 5)))
    assert read_darcy_mat(tmp_path / "s.mat")[0].shape == (2, 5, 5)


def test_missing_keys_and_bad_files(tmp_path):
    scipy.io.savemat(tmp_path / "x.mat", {"a": np.zeros((2, 4))})
    with pytest.raises(KeyError, match=r"lacks \['u'\].*holds \['a'\]"):
        read_burgers_mat(tmp_path / "x.mat")
    write_v73(tmp_path / "y.mat", coeff=np.zeros((2, 3, 3)))
    with pytest.raises(KeyError, match="sol"):
        read_darcy_mat(tmp_path / "y.mat")
    (tmp_path / "z.mat").write_bytes(b"garbage" * 40)
    with pytest.raises(ValueError, match="not a readable MATLAB file"):
        load_mat(tmp_path / "z.mat", ["a"])
    with pytest.raises(FileNotFoundError):
        load_mat(tmp_path / "none.mat", ["a"])
    with pytest.raises(TypeError, match="stored_type: expected a bool, got 1"):
        load_mat(tmp_path / "x.mat", ["a"], stored_type=1)
    scipy.io.savemat(tmp_path / "w.mat", {"a": np.zeros((2, 4)), "u": np.zeros((2, 5))})
    with pytest.raises(ValueError, match="equal shape"):
        read_burgers_mat(tmp_path / "w.mat")
    scipy.io.savemat(tmp_path / "n.mat", {"a": np.zeros((0, 4)), "u": np.zeros((0, 4))})
    with pytest.raises(ValueError, match=r"with B >= 1, got \(0, 4\)"):  # no samples
        read_burgers_mat(tmp_path / "n.mat")
    # a variable of the right name but not numbers: the file and the variable are named
    scipy.io.savemat(tmp_path / "s.mat", {"a": "hello", "u": np.zeros((2, 4))})
    with pytest.raises(ValueError, match=r"s\.mat': variable 'a' holds <U5 data"):
        read_burgers_mat(tmp_path / "s.mat")
    write_v73(tmp_path / "t.mat", coeff=np.array([b"ab", b"cd"]), sol=np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match=r"t\.mat': variable 'coeff' holds"):
        read_darcy_mat(tmp_path / "t.mat")
    # each of these was a raw h5py or Python error naming no file or variable
    with h5py.File(tmp_path / "g.mat", "w", userblock_size=512) as f:
        f.create_group("coeff")
        f["sol"] = np.zeros((2, 3, 3))
    with pytest.raises(ValueError, match=r"g\.mat': variable 'coeff' is a MATLAB struct"):
        read_darcy_mat(tmp_path / "g.mat")
    v73 = (tmp_path / "d.mat")
    write_v73(v73, coeff=np.zeros((64, 9, 9)), sol=np.zeros((64, 9, 9)))
    v73.write_bytes(v73.read_bytes()[:3000])
    with pytest.raises(ValueError, match=r"d\.mat' is not a readable MATLAB v7\.3 file"):
        read_darcy_mat(v73)
    with pytest.raises(TypeError, match="keys must be a sequence of variable names, got 5"):
        load_mat(tmp_path / "x.mat", 5)
    # MATLAB v7.3 keeps text as uint16 codes and [] as its dimensions: both read as numbers
    for name, attrs, what in (("c", {"MATLAB_class": b"char"}, "char data"),
                              ("e", {"MATLAB_class": b"double", "MATLAB_empty": 1},
                               "an empty array")):
        write_v73(tmp_path / f"{name}.mat", a=np.frombuffer(b"hello", np.uint8).astype(
            np.uint16)[None], u=np.zeros((1, 5)))
        with h5py.File(tmp_path / f"{name}.mat", "r+") as f:
            f["a"].attrs.update(attrs)
        with pytest.raises(ValueError, match=rf"{name}\.mat': variable 'a' is MATLAB {what}"):
            read_burgers_mat(tmp_path / f"{name}.mat")
    # a logical array in either version (v5 reads it as uint8 0/1, which passed for data)
    rng = np.random.default_rng(0)
    scipy.io.savemat(tmp_path / "l5.mat", {"a": rng.random((4, 8)) > 0.5, "u": np.zeros((4, 8))})
    write_v73(tmp_path / "l73.mat", a=np.ones((4, 8), np.uint8), u=np.zeros((4, 8)))
    with h5py.File(tmp_path / "l73.mat", "r+") as f:
        f["a"].attrs["MATLAB_class"] = b"logical"
    for name in ("l5", "l73"):
        with pytest.raises(ValueError, match=rf"{name}\.mat': variable 'a' is MATLAB logical "
                                             "data, expected a numeric array"):
            read_burgers_mat(tmp_path / f"{name}.mat")


def test_datasets_read_mat_files(tmp_path, darcy_arrays):
    rng = np.random.default_rng(2)
    a, u = rng.random((6, 32)), rng.random((6, 32))
    write_v73(tmp_path / "b.mat", a=a, u=u)
    ds = BurgersDataset(tmp_path / "b.mat", "test", 8, n_train=4, n_test=2)
    np.testing.assert_allclose(ds[1]["x"][:, 0].numpy(), a[5, ::4], rtol=1e-7)
    coeff, sol = darcy_arrays
    scipy.io.savemat(tmp_path / "d.mat", {"coeff": coeff, "sol": sol})
    dd = DarcyDataset(tmp_path / "d.mat", "train", 5, coarse_resolution=3, n_train=4, n_test=2,
                      dtype=torch.float64)
    np.testing.assert_array_equal(dd[3]["target"][..., 0].numpy(), sol[3, ::2, ::2])


def test_each_dataset_reads_a_mat_file_once(tmp_path, darcy_arrays, monkeypatch):
    """A dataset's passes over its source (sample count, first sample, split, normaliser fit)
    read a .mat file once, not once each: the original Darcy files hold 2 × 1024 fields of 421²."""
    reads = []
    real = datasets._mat.load_mat
    monkeypatch.setattr(datasets._mat, "load_mat", lambda *a: reads.append(a) or real(*a))
    rng = np.random.default_rng(3)
    scipy.io.savemat(tmp_path / "b.mat", {"a": rng.random((6, 32)), "u": rng.random((6, 32))})
    BurgersDataset(tmp_path / "b.mat", "test", 8, n_train=4, n_test=2)  # fits on "train"
    coeff, sol = darcy_arrays
    write_v73(tmp_path / "d.mat", coeff=coeff, sol=sol)
    DarcyDataset(tmp_path / "d.mat", "test", 5, coarse_resolution=3, n_train=4, n_test=2)
    DarcyInverseDataset(tmp_path / "d.mat", "test", 5, coarse_resolution=3, n_train=4,
                        n_test=2)
    assert [Path(a[0]).name for a in reads] == ["b.mat", "d.mat", "d.mat"]


def test_datasets_check_a_pair_of_arrays_as_they_check_files(darcy_arrays):
    """Arrays given as the source get the files' checks: Darcy fields square (a (B, 17, 33)
    pair gave inputs of one shape and a grid of another), finite (an inf gave an inf/nan
    normaliser), real."""
    coeff, sol = darcy_arrays
    wide = np.zeros((6, 9, 17))
    with pytest.raises(ValueError, match=r"expected darcy data of shape \(B, K, K\), got "
                                         r"\(6, 9, 17\)"):
        DarcyDataset((wide, wide), "train", 5, coarse_resolution=3, n_train=4, n_test=2)
    with pytest.raises(ValueError, match=r"expected darcy data"):
        DarcyInverseDataset((wide, wide), "train", 5, coarse_resolution=3, n_train=4,
                            n_test=2)
    bad = sol.copy()
    bad[4, 1, 1] = np.inf
    with pytest.raises(ValueError, match=r"variable 'u' has non-finite values in 1 sample\(s\), "
                                         r"the first is sample 4"):
        DarcyDataset((coeff, bad), "train", 5, coarse_resolution=3, n_train=4, n_test=2)
    a = np.ones((6, 16))
    a[2, 3] = np.nan
    with pytest.raises(ValueError, match=r"variable 'a' has non-finite values"):
        BurgersDataset((a, np.ones((6, 16))), "train", 8, n_train=4, n_test=2)
    with pytest.raises(ValueError, match=r"variable 'a' holds complex128 data"):
        BurgersDataset((np.ones((6, 16)) * 1j, np.ones((6, 16))), "train", 8, n_train=4,
                       n_test=2)
    ds = DarcyDataset((coeff, sol), "train", 5, coarse_resolution=3, n_train=4, n_test=2,
                      dtype=torch.float64)
    np.testing.assert_array_equal(ds[3]["target"][..., 0].numpy(), sol[3, ::2, ::2])


def test_non_finite_samples_are_named_before_any_training(tmp_path, darcy_arrays):
    """NaN or infinity in a sample is found on reading, naming the file, the variable and the
    sample, in both formats; a dataset gives it as its DataFileError."""
    a = np.zeros((5, 8))
    a[3, 2] = np.nan
    a[4, 0] = np.inf
    scipy.io.savemat(tmp_path / "b.mat", {"a": np.ones((5, 8)), "u": a})
    with pytest.raises(ValueError, match=r"b\.mat': variable 'u' .* 2 sample\(s\), the first is "
                                         r"sample 3"):
        read_burgers_mat(tmp_path / "b.mat")
    coeff, sol = darcy_arrays
    coeff = coeff.copy()
    coeff[5, 8, 8] = -np.inf
    write_v73(tmp_path / "d.mat", coeff=coeff, sol=sol)
    with pytest.raises(ValueError, match=r"variable 'coeff' .* 1 sample\(s\), the first is "
                                         r"sample 5"):
        read_darcy_mat(tmp_path / "d.mat")
    with pytest.raises(DataFileError, match=r"b\.mat': variable 'u' has non-finite"):
        BurgersDataset(tmp_path / "b.mat", "train", 8, n_train=4, n_test=1)
    scipy.io.savemat(tmp_path / "x.mat", {"a": np.zeros((2, 4))})
    with pytest.raises(DataFileError, match=r"lacks \['u'\]"):
        BurgersDataset(tmp_path / "x.mat", "train", 4, n_train=1, n_test=1)


def test_a_bool_array_in_an_hdf5_mat_file_is_refused(tmp_path):
    """An HDF5 .mat file written by h5py, not MATLAB (no MATLAB_class to say "logical"), holds
    its mask as a bool array: a mask, not a field, refused naming the file and the variable
    (as float64 it passed for a field of 0s and 1s), in the stored type too."""
    rng = np.random.default_rng(0)
    write_v73(tmp_path / "b.mat", a=rng.random((4, 8)) > 0.5, u=np.zeros((4, 8)))
    with h5py.File(tmp_path / "b.mat", "r") as f:
        assert f["a"].dtype == np.bool_ and "MATLAB_class" not in f["a"].attrs
    for stored_type in (False, True):
        with pytest.raises(ValueError, match=r"b\.mat': variable 'a' holds bool data \('b' "
                                             r"kind\), expected a numeric array"):
            load_mat(tmp_path / "b.mat", ["a", "u"], stored_type=stored_type)
    with pytest.raises(ValueError, match=r"b\.mat': variable 'a' holds bool data"):
        read_burgers_mat(tmp_path / "b.mat")
    assert load_mat(tmp_path / "b.mat", ["u"])["u"].shape == (4, 8)
