"""Command line: ``python -m galerkin_ext.data {generate,convert,info} ...`` (see ``--help``).

``generate {burgers,darcy,lorenz63,cde,kolmogorov,heat,elasticity}`` writes a resumable HDF5 file
(heat and elasticity: a ragged file, SPEC-gnot §3, with ``--preset quick|paper``; kolmogorov with
``--preset quick|paper|zero-shot``); ``info`` prints its metadata, completeness and (for the
continuum and ragged sets) summary statistics as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .._checks import cannot_make_folder
from .._cli import data_seed, positive_float, positive_int

PROBLEMS = ("burgers", "darcy", "lorenz63", "cde", "kolmogorov", "heat", "elasticity")
GNOT = ("heat", "elasticity")
# Problem-specific options (argparse dest -> problems whose generator takes it); refused for the
# others, never silently ignored.
_APPLIES = {
    "resolution": ("burgers", "darcy", "kolmogorov"),
    "workers": ("darcy", "heat", "elasticity"),
    "solve_resolution": ("burgers", "kolmogorov"),
    "n_steps": ("burgers",),
    "device": ("burgers", "kolmogorov"),
    "coef": ("darcy",),
    "sigma": ("darcy",),
    "tau": ("darcy",),
    "alpha": ("darcy",),
    "dt": ("lorenz63", "cde"),
    "t_end": ("lorenz63", "cde"),
    "grid": ("lorenz63", "cde"),
    "max_step": ("lorenz63", "kolmogorov"),
    "decay": ("cde",),
    "preset": (*GNOT, "kolmogorov"),
    "solve_dtype": ("kolmogorov",),
    "time": ("kolmogorov",),
    "dt_out": ("kolmogorov",),
    "nu": ("kolmogorov",),
    "wavenumber": ("kolmogorov",),
    "h": GNOT,
    "refine": GNOT,
    "targets": ("elasticity",),
    "with_cavity": ("elasticity",),
    "with_theta": ("elasticity",),
}
# convert: source -> (required options, options it takes)
_CONVERT_ARGS = {
    "geofno-elasticity": (("xy", "sigma"), ("xy", "sigma", "rr")),
    "gnot-pickle": (("file", "trust_pickle"), ("file", "trust_pickle")),
    "continuum-darcy": (("file",), ("file",)),
    "continuum-navier-stokes": (("file",), ("file", "axes")),
}


def _nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (kolmogorov's --time and --nu may be 0)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value}")
    return value


def _targets(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names such as u,v,vm, got "
                                         f"{text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the tests and ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m galerkin_ext.data",
        description="Generate, convert or inspect the data sets (HDF5): Burgers, Darcy, "
                    "Lorenz-63, the controlled ODE, the Kolmogorov flow, and the GNOT sets "
                    "heat and elasticity "
                    "(ragged; need the optional package triangle: pip install "
                    "\"galerkin_ext[fem]\"), or the original GNOT data sets converted.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a data set into FILE.h5 (resumable)")
    gen.add_argument("problem", choices=PROBLEMS)
    gen.add_argument("--out", required=True, help="output file, .h5 or .hdf5")
    gen.add_argument("--n-samples", type=positive_int, default=None,
                     help="number of samples (default: burgers 2048, darcy 2048 or 4000 with "
                          "--coef, lorenz63 and cde 10000, kolmogorov, heat and elasticity by "
                          "--preset)")
    gen.add_argument("--resolution", type=positive_int, default=None,
                     help="grid points per axis (default: burgers 8192, darcy 421 or 64 with "
                          "--coef, kolmogorov by --preset)")
    # default None so that a preset can bring its own (kolmogorov's zero-shot set: seed 1)
    gen.add_argument("--seed", type=data_seed, default=None,
                     help="sample i depends only on (seed, i); give a zero-shot set its own seed "
                          "(default 0; kolmogorov --preset zero-shot: 1)")
    gen.add_argument("--chunk-size", type=positive_int, default=None,
                     help="samples per stored chunk (default: burgers 256, darcy 32, lorenz63 "
                          "and cde 1000, heat and elasticity 50, kolmogorov 50, solved as one "
                          "batch); a resumed file keeps the chunk size it was begun with (the "
                          "data do not depend on it; kolmogorov's, and burgers' below 128 solve "
                          "points, only up to round-off, which batched FFTs make by the batch "
                          "and by torch's thread count, and kolmogorov's chaotic flow grows)")
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue an interrupted generation")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing file")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen.add_argument("--workers", type=positive_int, default=None,
                     help="darcy: worker processes (default: all usable cores); heat, "
                          "elasticity: (default 1)")
    gen.add_argument("--solve-resolution", type=positive_int, default=None,
                     help="burgers: grid the solver runs on before zero-padding (default 1024); "
                          "kolmogorov: grid the flow is solved on before spectral resampling to "
                          "--resolution (default: --resolution; zero-shot preset 832)")
    gen.add_argument("--n-steps", type=positive_int, default=None,
                     help="burgers: ETDRK4 steps (default t_end / 1e-3)")
    gen.add_argument("--device", default=None,
                     help="burgers, kolmogorov: torch device of the solver, cpu (default) or "
                          "cuda")
    gen.add_argument("--coef", choices=("lognormal", "piecewise"), default=None,
                     help="darcy: the continuum-attention coefficient, exp(g) or 12/3 where "
                          "g >= 0 / g < 0 (default: SPEC.md's set)")
    gen.add_argument("--sigma", type=positive_float, default=None,
                     help="darcy --coef lognormal: amplitude of g (default 12)")
    gen.add_argument("--tau", type=positive_float, default=None,
                     help="darcy: tau of the covariance (default 3, or 6 with --coef)")
    gen.add_argument("--alpha", type=positive_float, default=None,
                     help="darcy: exponent of the covariance, > 1 (default 2)")
    gen.add_argument("--dt", type=positive_float, default=None,
                     help="lorenz63/cde: uniform time step (default 0.01): t = 0, dt, ... <= "
                          "t_end")
    gen.add_argument("--t-end", type=positive_float, default=None,
                     help="lorenz63/cde: end of the time interval (default 2)")
    gen.add_argument("--grid", choices=("uniform", "nonuniform"), default=None,
                     help="lorenz63/cde: 'nonuniform' is the paper's grid (41), "
                          "{0.01 n, n <= 100} U {1 + 0.005 n, n = 1..200}")
    gen.add_argument("--max-step", type=positive_float, default=None,
                     help="lorenz63: largest RK4 step (default 1e-3); kolmogorov: largest "
                          "solver step (default: the largest dt-out / m <= 2.5e-3 * 416 / "
                          "solve-resolution: 2.5e-3 at 416, 0.025 at 32)")
    gen.add_argument("--decay", action="store_true", default=None,
                     help="cde: weight term j of the control by 1/j (the authors' code)")
    gen.add_argument("--preset", choices=("quick", "paper", "zero-shot"), default=None,
                     help="heat/elasticity: sample count and mesh size (default paper: heat "
                          "5500 at h 0.2, elasticity 1200 at h 0.035; quick: 250 at h 0.5 / "
                          "0.07); kolmogorov (default paper): paper 10000 at 416 in float64, "
                          "quick 1300 at 32 in float32, zero-shot 100 at 832 with seed 1")
    gen.add_argument("--solve-dtype", choices=("float32", "float64"), default=None,
                     help="kolmogorov: precision of the solver and of the stored fields "
                          "(default: by --preset, float64; quick float32)")
    gen.add_argument("--time", type=_nonnegative_float, default=None,
                     help="kolmogorov: time T of the input w(T) (default 11)")
    gen.add_argument("--dt-out", type=positive_float, default=None,
                     help="kolmogorov: the output is w(T + dt-out) (default 0.1)")
    gen.add_argument("--nu", type=_nonnegative_float, default=None,
                     help="kolmogorov: viscosity (default 1/70)")
    gen.add_argument("--wavenumber", type=positive_int, default=None,
                     help="kolmogorov: forcing -n cos(n y) with n = wavenumber (default 4)")
    gen.add_argument("--h", type=positive_float, default=None,
                     help="heat/elasticity: mesh size (default: by --preset)")
    gen.add_argument("--refine", action="store_true", default=None,
                     help="heat/elasticity: the refined evaluation set (triangles near the "
                          "interfaces/cavity split)")
    gen.add_argument("--targets", type=_targets, default=None,
                     help="elasticity: comma-separated targets from u,v,vm (default vm)")
    gen.add_argument("--with-cavity", action="store_true", default=None,
                     help="elasticity: add the input function 'cavity' (its boundary points)")
    gen.add_argument("--with-theta", action="store_true", default=None,
                     help="elasticity: store theta = the cavity radius at 42 angles")
    conv = sub.add_parser("convert", help="convert an original data set into FILE.h5")
    conv.add_argument("source", choices=tuple(_CONVERT_ARGS),
                      help="geofno-elasticity: Geo-FNO's elasticity set (Random_UnitCell_*.npy);"
                           " gnot-pickle: a data set pickled by GNOT's code; continuum-darcy, "
                           "continuum-navier-stokes: the continuum-attention paper's Darcy "
                           ".mat and Kolmogorov-flow .pt files")
    conv.add_argument("--xy", help="geofno-elasticity: the points, (N, 2, S) .npy")
    conv.add_argument("--sigma", help="geofno-elasticity: the stress, (N, S) .npy")
    conv.add_argument("--rr", help="geofno-elasticity, optional: the radii, (42, S) .npy, as "
                                   "theta")
    conv.add_argument("--file", help="gnot-pickle: the pickle, [[X, Y, theta, (f_1, ...)], "
                                     "...]; continuum-darcy: the .mat holding x and y, (s, s, "
                                     "N); continuum-navier-stokes: the .pt tensor (N, s, s, 2)")
    conv.add_argument("--trust-pickle", action="store_true",
                      help="gnot-pickle: required; unpickling runs code from the file")
    conv.add_argument("--axes", choices=("auto", "xy", "yx"),
                      help="continuum-navier-stokes: which field axis is x (default auto: "
                           "found from the forcing's mode in the mean vorticity)")
    conv.add_argument("--out", required=True, help="output file, .h5 or .hdf5")
    conv_mode = conv.add_mutually_exclusive_group()
    conv_mode.add_argument("--resume", action="store_true",
                           help="continue an interrupted conversion")
    conv_mode.add_argument("--overwrite", action="store_true", help="replace an existing file")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar")
    info = sub.add_parser("info", help="print the metadata and completeness of a data file")
    info.add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        required, allowed = _CONVERT_ARGS[args.source]
        for dest in ("xy", "sigma", "rr", "file", "trust_pickle", "axes"):
            flag = "--" + dest.replace("_", "-")
            if dest in required and not getattr(args, dest):
                parser.error(f"{flag} is required to convert {args.source}")
            if dest not in allowed and getattr(args, dest):
                parser.error(f"{flag} does not apply to {args.source}")
    if args.command == "generate":
        for dest, problems in _APPLIES.items():
            if getattr(args, dest) is not None and args.problem not in problems:
                parser.error(f"--{dest.replace('_', '-')} does not apply to {args.problem} "
                             f"(only to {', '.join(problems)})")
        if args.preset == "zero-shot" and args.problem != "kolmogorov":
            parser.error(f"--preset zero-shot applies to kolmogorov only, not to {args.problem}")
        if (args.problem == "burgers" and args.solve_resolution is not None
                and args.solve_resolution > (args.resolution or 8192)):
            parser.error(f"--solve-resolution: expected at most --resolution = "
                         f"{args.resolution or 8192} (the solve grid is zero-padded to it), got "
                         f"{args.solve_resolution}")
    from .storage import DataFileError, InterruptedWhenFinished, SolverError, partial_path

    out = getattr(args, "out", None)
    published_before = _published(out)
    try:
        if args.command == "info":
            from .ragged import inspect_ragged, is_ragged_file
            from .storage import inspect_h5

            inspect = inspect_ragged if is_ragged_file(args.file) else inspect_h5
            # strict JSON: a statistic of non-finite data is null, not NaN
            text = json.dumps(_finite(inspect(args.file)), indent=2, allow_nan=False)
            try:
                print(text, flush=True)
            except BrokenPipeError:  # a reader that stopped early (| head): no traceback
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if out is not None:  # (as the training scripts make theirs; the API, as open(), not)
            folder = Path(out).parent
            why = cannot_make_folder(folder)
            if why is not None:
                raise ValueError(f"out: cannot create the folder {str(folder)!r} ({why})")
        if args.command == "convert":
            path = _convert(args)
            print(f"wrote {path}")
            return 0
        common = {
            "resume": args.resume,
            "overwrite": args.overwrite,
            "progress": not args.no_progress,
        }
        # Unset options fall back on the generators' defaults.
        for dest in ("n_samples", "chunk_size", "sigma", "tau", "alpha", "dt", "t_end", "grid",
                     "max_step", "decay"):
            if getattr(args, dest) is not None:
                common[dest] = getattr(args, dest)
        if args.problem == "kolmogorov":
            path = _generate_kolmogorov(args, common)
            print(f"wrote {path}")
            return 0
        common["seed"] = 0 if args.seed is None else args.seed
        if args.problem == "burgers":
            from .generate import generate_burgers

            path = generate_burgers(
                args.out, resolution=args.resolution or 8192,
                solve_resolution=args.solve_resolution or 1024, n_steps=args.n_steps,
                device=args.device, **common,
            )
        elif args.problem == "darcy":
            from .generate import generate_darcy

            path = generate_darcy(
                args.out, resolution=args.resolution, coef=args.coef, workers=args.workers,
                **common,
            )
        elif args.problem in GNOT:
            path = _generate_gnot(args, common)
        elif args.problem == "lorenz63":
            from .generate import generate_lorenz63

            path = generate_lorenz63(args.out, **common)
        else:
            from .generate import generate_cde

            path = generate_cde(args.out, **common)
        print(f"wrote {path}")
        return 0
    except KeyboardInterrupt as err:
        # The signal came with the last rename, or after it: the file is this run's (another
        # one than before: os.replace gives it a new inode).
        if isinstance(err, InterruptedWhenFinished) or (
                out is not None and _published(out) not in (None, published_before)):
            print(f"\ninterrupted after {out} was finished; it is complete", file=sys.stderr)
        elif out is not None and partial_path(out).exists():
            print("\ninterrupted; completed chunks are kept, rerun with --resume to continue",
                  file=sys.stderr)
        else:  # before its partial file existed (an --overwrite leaves the old file alone)
            unchanged = f"; {out} is unchanged" if _published(out) is not None else ""
            print(f"\ninterrupted before anything was written{unchanged}", file=sys.stderr)
        return 130
    except (DataFileError, SolverError, FileExistsError, FileNotFoundError, PermissionError,
            ValueError, TypeError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _published(out: str | None) -> tuple[int, int, int] | None:
    """The identity of the file ``out`` (device, inode, modification time), ``None`` if there
    is none."""
    if out is None:
        return None
    try:
        st = os.stat(out)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _finite(value: object) -> object:
    """``value`` with every non-finite float (recursively) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _convert(args: argparse.Namespace) -> Path:
    """``convert geofno-elasticity|gnot-pickle|continuum-darcy|continuum-navier-stokes``."""
    from . import convert

    common = {"resume": args.resume, "overwrite": args.overwrite,
              "progress": not args.no_progress}
    if args.source == "geofno-elasticity":
        return convert.convert_geofno_elasticity(args.xy, args.sigma, args.out, rr=args.rr,
                                                 **common)
    if args.source == "continuum-darcy":
        return convert.convert_continuum_darcy(args.file, args.out, **common)
    if args.source == "continuum-navier-stokes":
        return convert.convert_continuum_navier_stokes(args.file, args.out,
                                                       axes=args.axes or "auto", **common)
    return convert.convert_gnot_pickle(args.file, args.out, trust_pickle=args.trust_pickle,
                                       **common)


def _generate_kolmogorov(args: argparse.Namespace, common: dict) -> Path:
    """``generate kolmogorov``: the preset's settings, then the options given."""
    from .generate import KOLMOGOROV_PRESETS, generate_kolmogorov

    kwargs = {**KOLMOGOROV_PRESETS[args.preset or "paper"], **common}
    for dest in ("seed", "resolution", "solve_resolution", "solve_dtype", "time", "dt_out",
                 "nu", "wavenumber", "device"):
        if getattr(args, dest) is not None:
            kwargs[dest] = getattr(args, dest)
    return generate_kolmogorov(args.out, **kwargs)


def _generate_gnot(args: argparse.Namespace, common: dict) -> Path:
    """``generate heat|elasticity``: the preset's defaults, then the given options."""
    from .generate import GNOT_PRESETS, generate_elasticity, generate_heat

    preset = GNOT_PRESETS[args.problem][args.preset or "paper"]
    kwargs = {**common, "h": args.h if args.h is not None else preset["h"],
              "n_samples": common.get("n_samples", preset["n_samples"]),
              "refine": bool(args.refine), "workers": args.workers or 1}
    if args.problem == "heat":
        return generate_heat(args.out, **kwargs)
    return generate_elasticity(args.out, **kwargs, targets=args.targets or ("vm",),
                               with_cavity=bool(args.with_cavity),
                               with_theta=bool(args.with_theta))


if __name__ == "__main__":
    sys.exit(main())
