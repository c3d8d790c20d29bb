"""data/generate.py's rarely checked promises: the summary statistics of every field, argument
checks made before any file exists, the settings the GNOT generators pass on and record, and the
worker pool a Darcy generation starts and must stop."""

import multiprocessing

import numpy as np
import pytest
from test_data_ragged import HAS_TRIANGLE

from galerkin_ext.data import generate as gen
from galerkin_ext.data import inspect_h5, read_h5
from galerkin_ext.data.ragged import read_header, read_ragged
from galerkin_ext.data.storage import partial_path

needs_triangle = pytest.mark.skipif(not HAS_TRIANGLE, reason="needs the optional package triangle")


def test_lorenz63_statistics_are_those_of_x_y_and_z(tmp_path):
    """Each of x, y, z summarises its own component (y = output[..., 0], z = output[..., 1])."""
    out = gen.generate_lorenz63(tmp_path / "l.h5", 3, dt=0.05, t_end=0.5, progress=False)
    stats = inspect_h5(out)["statistics"]
    data = read_h5(out, keys=("input", "output"))
    for name, values in (("x", data["input"][..., 0]), ("y", data["output"][..., 0]),
                         ("z", data["output"][..., 1])):
        assert stats[name]["count"] == values.size
        np.testing.assert_allclose([stats[name]["mean"], stats[name]["std"]],
                                   [values.mean(), values.std()], rtol=1e-12)


def test_a_cde_z0_above_pi_leaves_no_file(tmp_path):
    """z0 must lie in (-pi, pi]: past pi (below -pi is test_data_ode's case) it is refused with
    the other arguments, before the partial file is begun, not by the solver after it."""
    out = tmp_path / "c.h5"
    with pytest.raises(ValueError, match=r"^z0: expected a finite float > -3\.14159 and "
                                         r"<= 3\.14159, got 4\.0"):
        gen.generate_cde(out, 2, z0=4.0, progress=False)
    assert not out.exists() and not partial_path(out).exists()


@needs_triangle
def test_heat_generation_passes_refine_to_its_samples(tmp_path):
    """refine=True gives the refined evaluation meshes: the stored sample is
    heat_sample(refine=True)'s, which has more points than the unrefined one."""
    from galerkin_ext.data.heat import heat_sample

    out = gen.generate_heat(tmp_path / "h.h5", n_samples=1, seed=2, h=0.5, refine=True,
                            progress=False)
    assert read_header(out)["parameters"] == {"h": 0.5, "refine": True}
    stored = read_ragged(out, np.arange(1), fields=("query", "target")).sample(0)
    refined = heat_sample(0, seed=2, h=0.5, refine=True)
    np.testing.assert_array_equal(stored["query"]["points"], refined["query"]["points"])
    np.testing.assert_array_equal(stored["target"], refined["target"])
    assert len(refined["query"]["points"]) > len(heat_sample(0, seed=2, h=0.5)["query"]["points"])


@needs_triangle
def test_elasticity_records_every_setting_a_resume_must_match(tmp_path):
    """refine changes the meshes but not the file's layout: only the recorded parameters can
    keep a resume from mixing refined and unrefined samples."""
    for refine in (False, True):
        out = gen.generate_elasticity(tmp_path / f"e{int(refine)}.h5", n_samples=1, h=0.1,
                                      refine=refine, progress=False)
        assert read_header(out)["parameters"] == {
            "h": 0.1, "targets": ["vm"], "refine": refine, "with_cavity": False,
            "with_theta": False}


def test_darcy_generation_stops_the_worker_processes_it_started(tmp_path):
    """The pool of workers=2 is shut down before generate_darcy returns: its processes are
    gone then, not left to the garbage collector."""
    before = set(multiprocessing.active_children())
    gen.generate_darcy(tmp_path / "d.h5", 2, 9, workers=2, progress=False)
    assert set(multiprocessing.active_children()) - before == set()
