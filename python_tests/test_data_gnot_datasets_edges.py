"""data/gnot_datasets.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import h5py
import numpy as np
import pytest
import torch
from test_data_ragged import synthetic, write

from galerkin_ext.data.datasets import UnitGaussianNormalizer
from galerkin_ext.data.gnot_datasets import (
    RaggedDataset,
    RaggedNormalizers,
    SizeBucketSampler,
    batch_to,
    collate_ragged,
)
from galerkin_ext.data.ragged import RaggedWriter, read_ragged
from galerkin_ext.data.storage import DataFileError, partial_path


@pytest.fixture(scope="module")
def rfile(tmp_path_factory):
    return write(tmp_path_factory.mktemp("gd") / "r.h5", n=6, chunk=3)


@pytest.fixture(scope="module")
def train(rfile):
    return RaggedDataset(rfile, "train", n_train=4, dtype=torch.float64)


def test_normalizer_constructor_checks():
    z = UnitGaussianNormalizer(torch.randn(5, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="target: expected a UnitGaussianNormalizer, got Linear"):
        RaggedNormalizers(z, torch.nn.Linear(1, 1), {}, None)
    scalar = UnitGaussianNormalizer.from_statistics(torch.tensor(0.0), torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"theta: expected per-channel statistics of shape "
                                         r"\(c,\), got \(\)"):
        RaggedNormalizers(z, z, {}, scalar)
    # one eps for all, as the state dict records it: z's own 1e-5 encoded otherwise than the
    # 1e-8 it was saved with
    with pytest.raises(ValueError, match=r"^query: its eps 1e-05 is not eps = 1e-08, which these "
                                         r"normalisers share"):
        RaggedNormalizers(z, z, {}, None, eps=1e-8)
    fine = UnitGaussianNormalizer(torch.randn(5, 2, dtype=torch.float64), eps=1e-8)
    with pytest.raises(ValueError, match=r"^inputs\['a'\]: its eps 1e-05 is not eps = 1e-08"):
        RaggedNormalizers(fine, fine, {"a": z}, None, eps=1e-8)
    norms = RaggedNormalizers(z, z, {"a": z}, None, eps=1e-5)
    again = RaggedNormalizers.from_state_dict(norms.state_dict())
    x = torch.randn(3, 2, dtype=torch.float64)
    assert torch.equal(again.input_a.encode(x), z.encode(x))


def test_fit_checks(rfile):
    with pytest.raises(TypeError, match="data: expected RaggedArrays, got dict"):
        RaggedNormalizers.fit({})
    with pytest.raises(ValueError, match="data: the query points and targets must have been read"):
        RaggedNormalizers.fit(read_ragged(rfile, fields=("query",)))
    with pytest.raises(ValueError, match="needs >= 2 training samples, got 1"):
        RaggedNormalizers.fit(read_ragged(rfile, [0]))
    with pytest.raises(ValueError, match="data: the input function 'g' was not read"):
        RaggedNormalizers.fit(read_ragged(rfile, fields=("query", "target")))


def test_a_constant_target_channel_is_refused(tmp_path):
    """A target channel with one value everywhere normalises to 0, and its relative error (the
    loss) is x / 0: refused when the statistics are fitted, naming the channel, not an inf loss
    at the first step that the Trainer blamed on a sample's zero target."""
    def constant_vm(i):
        sample = synthetic(i)
        sample["target"][:, 1] = 2.5
        return sample

    path = write(tmp_path / "c.h5", n=4, chunk=2, fn=constant_vm)
    with pytest.raises(ValueError, match="target channel 'vm' has one value at every point of "
                                         "the 4 samples"):
        RaggedNormalizers.fit(read_ragged(path))


def test_state_dict_round_trip_and_checks(train):
    norm = train.normalizers
    state = dict(norm.state_dict())
    state["eps"] = float(state["eps"])  # a plain float (not a tensor) is taken as it is
    back = RaggedNormalizers.from_state_dict(state)
    assert back.named().keys() == norm.named().keys()
    for name, z in back.named().items():
        assert torch.equal(z.mean, norm.named()[name].mean) and z.eps == norm.named()[name].eps
    with pytest.raises(TypeError, match="state: expected a state dict, got list"):
        RaggedNormalizers.from_state_dict([])
    with pytest.raises(KeyError, match="state: missing 'target.std'; not a RaggedNormalizers"):
        RaggedNormalizers.from_state_dict({k: v for k, v in state.items() if k != "target.std"})
    with pytest.raises(KeyError, match="state: missing 'theta.std'"):
        RaggedNormalizers.from_state_dict({k: v for k, v in state.items() if k != "theta.std"})
    with pytest.raises(TypeError, match="config: expected a dict of statistics, got list"):
        RaggedNormalizers.from_config([])
    # eps 0 passed this check and failed in the constructor under the name 'eps'
    with pytest.raises(ValueError, match=r"^state\['eps'\]: expected a finite float > 0, got 0"):
        RaggedNormalizers.from_state_dict({**state, "eps": 0.0})
    config = {name: {"mean": z.mean.tolist(), "std": z.std.tolist(), "eps": 0.0}
              for name, z in norm.named().items()}
    with pytest.raises(ValueError, match=r"^config\['query'\]\['eps'\]: expected a finite "
                                         r"float > 0, got 0"):
        RaggedNormalizers.from_config(config)


def test_normalizers_of_other_data_are_refused(rfile, train, tmp_path):
    other = write(tmp_path / "o.h5", n=3, chunk=3, fn=lambda i: {
        **synthetic(i), "target": synthetic(i)["target"][:, :1], "target_names": ["u"],
        "query": {**synthetic(i)["query"], "points": np.c_[synthetic(i)["query"]["points"],
                                                           np.zeros(len(synthetic(i)["target"]))]},
        "inputs": {"g": {**synthetic(i)["inputs"]["g"],
                         "points": np.c_[synthetic(i)["inputs"]["g"]["points"],
                                         np.zeros(len(synthetic(i)["inputs"]["g"]["points"]))],
                         "values": None},
                   "cavity": {**synthetic(i)["inputs"]["cavity"],
                              "points": np.c_[synthetic(i)["inputs"]["cavity"]["points"],
                                              np.zeros(len(synthetic(i)["inputs"]["cavity"]
                                                           ["points"]))]}}})
    with pytest.raises(ValueError, match=r"fitted on other data than this file holds "
                                         r"\(coordinates: 2 vs 3; target channels: 2 vs 1; "
                                         r"input values \{'g': 1\} vs \{\}"):
        RaggedDataset(other, "test", n_test=1, normalizers=train.normalizers)


def test_dataset_checks(rfile, train, tmp_path):
    with pytest.raises(TypeError, match="path: expected the path of a ragged .h5 file, got int"):
        RaggedDataset(3, n_train=4)
    with pytest.raises(ValueError, match="n_test: the file has 6 samples, fewer than 7"):
        RaggedDataset(rfile, "test", n_test=7, normalizers=train.normalizers)
    with pytest.raises(ValueError, match="n_train: fitting the normalisers needs >= 2 training "
                                         "samples, got 1"):
        RaggedDataset(rfile, "train", n_train=1)
    with pytest.raises(ValueError, match="n_test: needed for split='test'"):
        RaggedDataset(rfile, "test", normalizers=train.normalizers)
    for split in ({"a": 1}, [], [[0, 1]], [0.5]):
        with pytest.raises(ValueError, match="split: expected 'train', 'test' or a non-empty "
                                             "sequence of sample indices"):
            RaggedDataset(rfile, split, normalizers=train.normalizers)


def test_an_incomplete_file_is_refused(tmp_path):
    out = tmp_path / "p.h5"
    from galerkin_ext.data.ragged import RaggedLayout
    w = RaggedWriter.open(out, generator="synthetic", parameters={}, seed=0, n_samples=4,
                          chunk_size=2, layout=RaggedLayout.from_sample(synthetic(0)))
    w.write_chunk(0, [synthetic(0), synthetic(1)])
    w.close()
    with pytest.raises(DataFileError, match=r"is incomplete \(2 of 4 samples\); finish it"):
        RaggedDataset(partial_path(out), n_train=2)


def test_mesh_weights_that_sum_to_zero_are_refused(rfile, tmp_path):
    bad = tmp_path / "w.h5"
    bad.write_bytes(rfile.read_bytes())
    with h5py.File(bad, "r+") as f:  # sample 1's query weights, zeroed (only an edit does it)
        a, b = f["query/offsets"][1:3]
        f["query/weights"][a:b] = 0.0
    with pytest.raises(DataFileError, match="query/weights: sample 1 has weights that do not sum "
                                            "to a positive number"):
        RaggedDataset(bad, "train", n_train=4, weights="mesh")


def test_size_properties(train):
    assert train.space_dim == train.query_dim == 2


def test_collation_item_checks(train):
    a, b = train[0], train[1]
    with pytest.raises(TypeError, match=r"items\[1\]: expected a dict of RaggedDataset, got list"):
        collate_ragged([a, []])
    with pytest.raises(TypeError, match=r"items\[0\]: weight: expected a floating tensor of rank "
                                        r"1, got torch.int64"):
        collate_ragged([{**a, "weight": a["weight"].long()}])
    with pytest.raises(TypeError, match=r"items\[0\]: inputs and input_weights: expected lists "
                                        "of equal length"):
        collate_ragged([{**a, "input_weights": a["input_weights"][:1]}])
    with pytest.raises(ValueError, match=r"items\[0\]: inputs\[0\]: expected \(M, b\) with M >= 1"):
        collate_ragged([{**a, "input_weights": [a["input_weights"][0][:-1],
                                                a["input_weights"][1]]}])
    with pytest.raises(TypeError, match=r"items\[0\]: weight, target: expected x's dtype "
                                        "torch.float64, got torch.float32"):
        collate_ragged([{**a, "weight": a["weight"].float()}])
    with pytest.raises(ValueError, match=r"items\[1\]: theta differs in presence or shape"):
        collate_ragged([a, {**b, "theta": None}])
    with pytest.raises(ValueError, match=r"items\[1\]: has a label where items\[0\] has none"):
        collate_ragged([a, {k: v for k, v in b.items() if k != "label"}])
    with pytest.raises(TypeError, match="batch: expected a dict from collate_ragged, got list"):
        batch_to([], "cpu")


def test_sampler_checks_and_set_epoch_during_a_pass():
    with pytest.raises(ValueError, match="lengths: expected a non-empty 1-D sequence of ints"):
        SizeBucketSampler([], 2)
    s = SizeBucketSampler([3, 5, 2, 7, 1], 2, seed=1)
    it = iter(s)
    first = next(it)
    s.set_epoch(5)  # chosen meanwhile: the pass's end does not advance it to 1
    rest = list(it)
    assert sorted(sum([first, *rest], [])) == [0, 1, 2, 3, 4]
    assert [first, *rest] == s.batches(0) and s.epoch == 5
    assert list(s) == s.batches(5) and s.epoch == 6


def test_items_hold_theta_normalised_by_the_training_statistics(rfile, train):
    """θ is z-scored per component with the training split's unbiased statistics, in the items
    of both splits and in a collated batch (the round trips elsewhere compare two datasets that
    would both hold it raw)."""
    raw = np.stack([synthetic(i)["theta"] for i in range(6)])
    mean, std = raw[:4].mean(0), raw[:4].std(0, ddof=1)
    expected = (raw - mean) / (std + 1e-8)
    np.testing.assert_allclose(train[3]["theta"].numpy(), expected[3], rtol=1e-12)
    test = RaggedDataset(rfile, "test", n_test=2, normalizers=train.normalizers,
                         dtype=torch.float64)
    np.testing.assert_allclose(test[1]["theta"].numpy(), expected[5], rtol=1e-12)
    batch = collate_ragged([train[0], train[2]])
    np.testing.assert_allclose(batch["theta"].numpy(), expected[[0, 2]], rtol=1e-12)


def test_a_nan_at_a_samples_first_point_names_that_sample(rfile, tmp_path):
    """The fit maps the first non-finite row to its sample: a NaN in the first target row of
    sample 2 is sample 2's (the row at an offset belongs to the sample it starts)."""
    bad = tmp_path / "nan.h5"
    bad.write_bytes(rfile.read_bytes())
    with h5py.File(bad, "r+") as f:
        first = f["query/offsets"][2]
        f["target/values"][first, 1] = np.nan
    with pytest.raises(ValueError, match="data: target/values of sample 2 has NaN or infinity"):
        RaggedNormalizers.fit(read_ragged(bad))


def test_sampler_drop_last_keeps_a_complete_last_batch():
    """With drop_last and N divisible by the batch size no batch is incomplete, so none is
    dropped: 12 samples in batches of 4 are 3 batches holding every index."""
    s = SizeBucketSampler(list(range(1, 13)), 4, bucket=8, seed=3, drop_last=True)
    batches = list(s)
    assert len(s) == len(batches) == 3
    assert sorted(sum(batches, [])) == list(range(12))


def test_sampler_shuffles_the_batches_across_and_within_buckets():
    """The batches of one sorted bucket come out in a random order, which changes with the
    epoch: not by increasing N (a sampler that left them in bucket order fed a model its
    smallest sets first, every epoch alike)."""
    lengths = list(range(1, 41))
    s = SizeBucketSampler(lengths, 2, bucket=40, seed=0)
    e0, e1 = s.batches(0), s.batches(1)
    assert sorted(map(sorted, e0)) == sorted(map(sorted, e1)) == [[2 * i, 2 * i + 1]
                                                                   for i in range(20)]
    largest = [max(lengths[j] for j in b) for b in e0]
    assert largest != sorted(largest) and e0 != e1
