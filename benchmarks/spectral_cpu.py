"""The two paths of the spectral convolutions' product on the CPU, and the rule between them.

    python benchmarks/spectral_cpu.py --out benchmarks/results/spectral_cpu_xeon.json

``layers.fourier.spectral_product`` (the product of SpectralConv, SpectralConv1d and
SpectralConv2d: ``irfft2(W(k) · rfft2(x)(k))`` over the kept modes) runs on the CPU either
through ``torch.fft`` (``fft``) or as products with the kept rows of the DFT matrices
(``matmul``), the latter where ``K <= 24`` and ``2 K < p₂`` (K kept columns of the real
FFT's axis). This times both, forward and forward+backward (gradients of the input and the
weights), medians of ``--reps`` repetitions interleaved over the paths, at 32 channels on
square grids with the modes SpectralConv keeps (``m`` per sign along the first axis, ``m``
along the second, fewer where the grid does not resolve them), with batches of about 40,000
points, and on the 1-D grids of the Burgers decoder (``p₁ = 1``; there the FFT path is
``spectral_product_1d``'s own, ``rfft``/``irfft``, which SpectralConv1d runs, not the 2-D one over
a grid of one row, which took about twice as long). Each row records the path the rule picks
and whether it was the faster one.
"""

from __future__ import annotations

from functools import partial

import torch
from timing import forward_backward_medians, op_parser, write_results  # (this folder)

from galerkin_ext._cli import positive_int
from galerkin_ext.layers import fourier

SIZES = (8, 16, 29, 32, 36, 43, 64, 85, 104, 128, 141, 211, 256, 416)
MODES = (4, 8, 12, 16, 24)
LINES = (512, 2048, 8192)  # the 1-D cases, 16 modes
POINTS = 40_000  # per batch, about
CHANNELS = 32
PATHS = {"fft": fourier._spectral_product_fft, "matmul": fourier._spectral_product_matmul}


def _line_fft(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with fourier.ffts_only():
        return fourier.spectral_product_1d(x[:, 0], w[:, :, 0], "ortho")


def _line_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return fourier._spectral_product_matmul(x, w, 1, "ortho")[:, 0]


LINE_PATHS = {"fft": _line_fft, "matmul": _line_matmul}  # x (B, 1, n, c), w (c, c, 1, K)


def cases(sizes: list[int], modes: list[int],
          lines: list[int]) -> list[tuple[int, int, int, int, int, int]]:
    """(batch, p1, p2, n_pos, n_neg, K) of every measured case."""
    out = []
    for p in sizes:
        kept = {(min(m, (p - 1) // 2 + 1), min(m, (p - 1) // 2)) for m in modes}
        for n_pos, n_neg in sorted(kept):  # a grid that resolves fewer modes: once
            out.append((max(1, POINTS // (p * p)), p, p, n_pos, n_neg, n_pos))
    out += [(max(1, min(8, POINTS // n)), 1, n, 1, 0, min(16, n // 2 + 1)) for n in lines]
    return out


def time_paths(batch: int, p1: int, p2: int, n_pos: int, n_neg: int, cols: int,
               reps: int) -> dict[str, tuple[float, float]]:
    """Median forward and forward+backward milliseconds of each path."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, p1, p2, CHANNELS, generator=gen, requires_grad=True)
    w = torch.randn(CHANNELS, CHANNELS, n_pos + n_neg, cols, generator=gen,
                    dtype=torch.complex64, requires_grad=True)
    grad = torch.randn(batch, p1, p2, CHANNELS, generator=gen)
    if p1 == 1:
        paths = {name: partial(path, x, w) for name, path in LINE_PATHS.items()}
        grad = grad[:, 0]
    else:
        paths = {name: partial(path, x, w, n_pos, "ortho") for name, path in PATHS.items()}
    return forward_backward_medians(paths, (x, w), grad, reps)


def main() -> None:
    p = op_parser(__doc__, reps=8)
    p.add_argument("--sizes", type=positive_int, nargs="*", default=list(SIZES),
                   help="the square grids' sides, none for the lines alone (default: "
                        "%(default)s)")
    p.add_argument("--modes", type=positive_int, nargs="+", default=list(MODES),
                   help="the modes m kept on the square grids (default: %(default)s)")
    p.add_argument("--lines", type=positive_int, nargs="+", default=list(LINES),
                   help="the 1-D grids' points (default: %(default)s)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'B':>3} {'p1':>4} {'p2':>5} {'R':>3} {'K':>3}   fwd+bwd ms fft / matmul   "
          "fft/matmul  rule    rule's pick faster")
    for batch, p1, p2, n_pos, n_neg, cols in cases(args.sizes, args.modes, args.lines):
        t = time_paths(batch, p1, p2, n_pos, n_neg, cols, args.reps)
        rule = "matmul" if fourier._matmuls_pay(torch.empty(0), cols, p2) else "fft"
        other = "fft" if rule == "matmul" else "matmul"
        faster = t[rule][1] <= t[other][1]
        rows.append({"batch": batch, "p1": p1, "p2": p2, "R": n_pos + n_neg, "K": cols,
                     "channels": CHANNELS, "fft_fwd_ms": t["fft"][0],
                     "fft_fwd_bwd_ms": t["fft"][1], "matmul_fwd_ms": t["matmul"][0],
                     "matmul_fwd_bwd_ms": t["matmul"][1], "rule": rule,
                     "rule_is_faster": faster})
        print(f"{batch:3d} {p1:4d} {p2:5d} {n_pos + n_neg:3d} {cols:3d}   "
              f"{t['fft'][1]:9.2f} / {t['matmul'][1]:8.2f}     "
              f"{t['fft'][1] / t['matmul'][1]:6.2f}x   {rule:6s}  {faster}")
    write_results(args, rows)


if __name__ == "__main__":
    main()
