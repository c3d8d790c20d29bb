"""Command line: ``python -m galerkin_ext.data {generate,info} ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .._cli import nonnegative_int, positive_int


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the tests and ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m galerkin_ext.data",
        description="Generate or inspect the Burgers/Darcy data sets (HDF5).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a data set into FILE.h5 (resumable)")
    gen.add_argument("problem", choices=("burgers", "darcy"))
    gen.add_argument("--out", required=True, help="output file, .h5 or .hdf5")
    gen.add_argument("--n-samples", type=positive_int, default=2048,
                     help="number of samples (default 2048 for both problems)")
    gen.add_argument("--resolution", type=positive_int, default=None,
                     help="grid points per axis (default: burgers 8192, darcy 421)")
    gen.add_argument("--seed", type=nonnegative_int, default=0)
    gen.add_argument("--chunk-size", type=positive_int, default=None,
                     help="samples per stored chunk (default: burgers 256, darcy 32)")
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue an interrupted generation")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing file")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen.add_argument("--workers", type=positive_int, default=None,
                     help="darcy: worker processes (default: all usable cores)")
    gen.add_argument("--solve-resolution", type=positive_int, default=1024,
                     help="burgers: grid the solver runs on before zero-padding (default 1024)")
    gen.add_argument("--n-steps", type=positive_int, default=None,
                     help="burgers: ETDRK4 steps (default t_end / 1e-3)")
    gen.add_argument("--device", default=None, help="burgers: torch device, e.g. cuda")
    info = sub.add_parser("info", help="print the metadata and completeness of a data file")
    info.add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    from .storage import DataFileError

    try:
        if args.command == "info":
            from .storage import inspect_h5

            print(json.dumps(inspect_h5(args.file), indent=2))
            return 0
        common = {
            "n_samples": args.n_samples,
            "seed": args.seed,
            "resume": args.resume,
            "overwrite": args.overwrite,
            "progress": not args.no_progress,
        }
        if args.chunk_size is not None:
            common["chunk_size"] = args.chunk_size
        if args.problem == "burgers":
            from .generate import generate_burgers

            path = generate_burgers(
                args.out, resolution=args.resolution or 8192,
                solve_resolution=args.solve_resolution, n_steps=args.n_steps,
                device=args.device, **common,
            )
        else:
            from .generate import generate_darcy

            path = generate_darcy(
                args.out, resolution=args.resolution or 421, workers=args.workers, **common
            )
        print(f"wrote {path}")
        return 0
    except KeyboardInterrupt:
        print(
            "\ninterrupted; completed chunks are kept, rerun with --resume to continue",
            file=sys.stderr,
        )
        return 130
    except (DataFileError, FileExistsError, FileNotFoundError, PermissionError,
            ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
