"""Parameters and forward FLOPs of the continuum-attention paper's models at its 416² grid and
channel widths 32, 64, 96 and 128: the costs its Figures 10 and 11 set errors against, and the
scalings of its Table 2 (galerkin_ext.complexity's convention: 2mnk a product, 5 r log2 r a
complex FFT of length r; activations, softmax and normalisations not counted).

    python benchmarks/complexity.py --out benchmarks/results/complexity.json

Every model is built and run on the meta device: nothing is computed or allocated, so the
quadratic TNO at N = 416² (173,056 points) is counted in a second. One forward pass of one
sample (batch 1); the TNO with plain softmax weights (the quadrature weights cost no products).
"""

from __future__ import annotations

import argparse

import torch

from galerkin_ext._cli import writable_file
from galerkin_ext.complexity import forward_flops, parameter_count
from galerkin_ext.models import build_model
from galerkin_ext.training import command_line, write_json

RESOLUTION = 416  # the paper's Darcy (piecewise) and Kolmogorov grids
WIDTHS = (32, 64, 96, 128)
# model -> (build_model name, the arguments set to the channel width, fixed arguments). The
# transformers' feed-forward width follows d_model by default: the paper's Table 4 counts
# 6 d^2 + 2 d per encoder layer, 4 d^2 for Q, K, V, W_o and 2 d^2 for a feed-forward block
# d -> d -> d; the FNO's lift and projection stay 128 wide (Table 4).
MODELS = {
    "FNO": ("fno_ca", ("width",), {}),
    "AFNO": ("afno", ("d_model",), {"grid": (RESOLUTION, RESOLUTION)}),
    "TNO": ("tno_darcy", ("d_model",), {}),
    "ViT NO": ("vitno", ("d_model",), {}),
    "FANO": ("fano", ("d_model",), {}),
}


def count(name: str, width: int, resolution: int) -> dict:
    registry_name, width_args, fixed = MODELS[name]
    with torch.device("meta"):
        model = build_model(registry_name, **fixed, **dict.fromkeys(width_args, width))
        if name == "TNO":  # point sets: (B, N, 1) values at (N, 2) points
            args = (torch.empty(1, resolution**2, 1), torch.empty(resolution**2, 2))
            kwargs = {"weight": None}
        else:
            args = (torch.empty(1, resolution, resolution, 1),
                    torch.empty(resolution, resolution, 2))
            kwargs = {}
    return {"model": name, "width": width, "resolution": resolution,
            "parameters": parameter_count(model),
            "forward_flops": forward_flops(model, *args, **kwargs)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    args = p.parse_args(argv)
    records = []
    for name in MODELS:
        for width in WIDTHS:
            record = count(name, width, RESOLUTION)
            records.append(record)
            print(f"{name:7s} width {width:4d}: {record['parameters']:>12,d} parameters, "
                  f"{record['forward_flops'] / 1e9:10.1f} GFLOP", flush=True)
    write_json(args.out, {"command": command_line(), "records": records})


if __name__ == "__main__":
    main()
