"""Data for the three experiments of the Galerkin Transformer paper (SPEC §4), the data part
of the continuum-attention experiments (SPEC-continuum §3: Lorenz-63, controlled ODE, lognormal
and piecewise-constant Darcy, Kolmogorov flow) and the GNOT sets (SPEC-gnot §3-4: heat,
elasticity; ragged).

Modules (imported lazily, so the solver worker processes stay light):

* :mod:`.random_fields` -- seeded Gaussian random fields (Burgers ``u0``, Darcy coefficients);
* :mod:`.burgers` -- :func:`solve_burgers`, pseudo-spectral ETDRK4, CPU or GPU;
* :mod:`.darcy` -- :func:`solve_darcy`, 5-point finite differences, sparse direct solve;
* :mod:`.ode` -- time grids, RK4, Lorenz-63, the controlled ODE's exact solution;
* :mod:`.kolmogorov` -- :func:`solve_kolmogorov`, pseudo-spectral Navier-Stokes (vorticity,
  2/3 rule, integrating-factor RK4) on the torus, CPU or GPU; its initial fields and spectral
  resampling;
* :mod:`.storage` -- the HDF5 schema, resumable chunked writing and checked reading;
* :mod:`.ragged` -- the ragged schema (samples of different sizes): resumable writer of any
  ``sample_fn(index)``, checked reader, inspection;
* :mod:`.generate` -- :func:`generate_burgers`, :func:`generate_darcy`,
  :func:`generate_lorenz63`, :func:`generate_cde`, :func:`generate_kolmogorov` (and its
  :data:`KOLMOGOROV_PRESETS`), :func:`generate_heat`, :func:`generate_elasticity`;
* :mod:`.datasets` -- PyTorch datasets (Burgers, Darcy forward and inverse; the ODE sets,
  continuum Darcy and the Kolmogorov flow), normaliser;
* :mod:`.gnot_datasets` -- the ragged dataset, its normalisers, padding collation and a
  size-bucketing batch sampler;
* :mod:`.mat` -- readers for the original ``.mat`` benchmark files;
* :mod:`.convert` -- :func:`convert_geofno_elasticity`, :func:`convert_gnot_pickle`: the
  original GNOT data sets (Geo-FNO's elasticity arrays, GNOT's pickles) as ragged files;
  :func:`convert_continuum_darcy`, :func:`convert_continuum_navier_stokes`: the
  continuum-attention paper's Darcy ``.mat`` and Kolmogorov-flow ``.pt`` files as ours.

Command line: ``python -m galerkin_ext.data generate
{burgers,darcy,lorenz63,cde,kolmogorov,heat,elasticity} --out FILE.h5 ...``, ``python -m
galerkin_ext.data convert geofno-elasticity --xy XY.npy --sigma SIGMA.npy [--rr RR.npy] --out
FILE.h5``,
``python -m galerkin_ext.data convert gnot-pickle --file DATA.pkl --trust-pickle --out FILE.h5``,
``python -m galerkin_ext.data convert continuum-darcy|continuum-navier-stokes --file SOURCE
--out FILE.h5`` and ``python -m galerkin_ext.data info FILE.h5``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "solve_burgers": "burgers",
    "solve_darcy": "darcy",
    "assemble_darcy_matrix": "darcy",
    "sample_periodic_grf_1d": "random_fields",
    "sample_neumann_grf_2d": "random_fields",
    "sample_darcy_coefficient": "random_fields",
    "threshold_coefficient": "random_fields",
    "generate_burgers": "generate",
    "generate_darcy": "generate",
    "generate_lorenz63": "generate",
    "generate_cde": "generate",
    "generate_kolmogorov": "generate",
    "kolmogorov_time_step": "generate",
    "KOLMOGOROV_PRESETS": "generate",
    "generate_heat": "generate",
    "generate_elasticity": "generate",
    "convert_geofno_elasticity": "convert",
    "GEOFNO_ELASTICITY": "convert",
    "convert_gnot_pickle": "convert",
    "convert_continuum_darcy": "convert",
    "convert_continuum_navier_stokes": "convert",
    "GNOT_PICKLE": "convert",
    "write_ragged": "ragged",
    "read_ragged": "ragged",
    "inspect_ragged": "ragged",
    "RaggedLayout": "ragged",
    "RaggedDataset": "gnot_datasets",
    "RaggedNormalizers": "gnot_datasets",
    "collate_ragged": "gnot_datasets",
    "SizeBucketSampler": "gnot_datasets",
    "time_grid": "ode",
    "rk4": "ode",
    "solve_lorenz63": "ode",
    "sample_lorenz63_initial": "ode",
    "sample_cde_control": "ode",
    "cde_control": "ode",
    "solve_cde": "ode",
    "solve_kolmogorov": "kolmogorov",
    "sample_initial_vorticity": "kolmogorov",
    "resample_periodic": "kolmogorov",
    "read_h5": "storage",
    "inspect_h5": "storage",
    "DataFileError": "storage",
    "DataMismatchError": "storage",
    "SolverError": "storage",
    "BurgersDataset": "datasets",
    "DarcyDataset": "datasets",
    "DarcyInverseDataset": "datasets",
    "ODEDataset": "datasets",
    "ContinuumDarcyDataset": "datasets",
    "KolmogorovDataset": "datasets",
    "UnitGaussianNormalizer": "datasets",
    "central_gradient_1d": "datasets",
    "central_gradient_2d": "datasets",
    "block_average": "datasets",
    "check_darcy_grids": "datasets",
    "paired_coarse": "datasets",
    "load_mat": "mat",
    "read_burgers_mat": "mat",
    "read_darcy_mat": "mat",
}
_SUBMODULES = ("random_fields", "burgers", "darcy", "ode", "kolmogorov", "storage", "ragged",
               "generate", "datasets", "gnot_datasets", "mat", "convert")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
