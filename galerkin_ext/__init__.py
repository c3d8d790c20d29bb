"""galerkin_ext: Fourier- and Galerkin-type attention for operator learning.

Submodules: ``ops`` (the compiled attention ops), ``reference`` (plain-PyTorch reference).
"""

__version__ = "0.1.0"
