"""Activation modules of the layers and models, by name."""

from __future__ import annotations

from torch import nn

from .._checks import check_choice

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}


def make_activation(name: str, arg_name: str = "activation") -> nn.Module:
    """A fresh activation module from its name: ``'relu'``, ``'silu'`` or ``'gelu'``."""
    check_choice(name, arg_name, list(_ACTIVATIONS))
    return _ACTIVATIONS[name]()
