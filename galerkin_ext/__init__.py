"""galerkin_ext: Fourier- and Galerkin-type attention for operator learning.

Subpackages (imported on use, so that ``import galerkin_ext`` stays light):

* ``ops`` -- the compiled attention ops (C++/CUDA), with autograd and fake kernels: the Galerkin,
  Fourier and normalised (GNOT) types on one op core, ``kv_reduce`` and ``q_apply``;
* ``functional`` -- the same formulas in plain PyTorch, where no compiled op applies;
* ``quadrature`` -- quadrature weights of key points (1-D trapezoid, grids, simplicial meshes);
* ``reference`` -- the same math in plain PyTorch, the way the original code computes it;
* ``layers``, ``models`` -- the paper's networks (``models.build_model``);
* ``data`` -- data generation (Burgers, Darcy, Lorenz-63, controlled ODE, Kolmogorov flow,
  heat, elasticity), HDF5 storage, datasets, converters of the papers' files;
* ``losses``, ``training`` -- relative L2/H¹ losses and the trainer of the examples;
* ``domain`` -- domain-parallel attention (one sample's points on several processes);
* ``complexity`` -- parameter and FLOP counts.
"""

__version__ = "0.1.0"
