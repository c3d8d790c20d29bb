"""The Transformer encoder layer of the paper (post-norm residual) and its feed-forward block."""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_features, check_int, check_probability
from .activation import make_activation
from .attention import SimpleAttention
from .dropout import Dropout


class FeedForward(nn.Module):
    """Pointwise ``Linear(d_model, dim_feedforward) → act → dropout → Linear(·, d_model)``.

    Input ``(..., d_model)``, output ``(..., d_model)``.
    """

    def __init__(self, d_model: int, dim_feedforward: int, activation: str = "relu",
                 dropout: float = 0.0) -> None:
        super().__init__()
        check_int(d_model, "d_model")
        check_int(dim_feedforward, "dim_feedforward")
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = make_activation(activation)
        self.dropout = Dropout(check_probability(dropout, "dropout"))
        self.linear2 = nn.Linear(dim_feedforward, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` → ``(..., d_model)``."""
        check_features(x, "x", self.linear1.in_features, self)
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class EncoderLayer(nn.Module):
    """``x = x + drop(Attn(x, pos))``, [LN], ``x = x + drop(FFN(x))``, [LN].

    The two residual-stream layer norms exist only for ``norm='layer'`` (the paper's "regular
    Ln" rows); otherwise ``norm`` is passed to :class:`SimpleAttention` (``'attn'``, the paper's
    default: the norm inside the attention, no residual LN).

    Args:
        d_model, n_head, attention_type, pos_dim, eps, xavier_init, diagonal_weight,
            reference_dropout: as in :class:`SimpleAttention`.
        dim_feedforward: hidden width of the feed-forward block (default ``2 * d_model``).
        norm: ``'attn'``, ``'layer'``, ``'instance'`` or ``None``.
        dropout: dropout on the two residual branches.
        ffn_dropout: dropout inside the feed-forward block (default ``dropout``).
        attn_dropout: training-time dropout on the attention matrix (default ``dropout``).
        activation: of the feed-forward block, ``'relu'`` (paper), ``'silu'`` or ``'gelu'``.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        attention_type: str = "galerkin",
        pos_dim: int = 0,
        dim_feedforward: int | None = None,
        norm: str | None = "attn",
        dropout: float = 0.0,
        ffn_dropout: float | None = None,
        attn_dropout: float | None = None,
        eps: float = 1e-5,
        xavier_init: float = 1e-2,
        diagonal_weight: float = 1e-2,
        activation: str = "relu",
        reference_dropout: bool = False,
    ) -> None:
        super().__init__()
        check_probability(dropout, "dropout")
        if ffn_dropout is not None:  # named here: FeedForward would call it its own dropout
            check_probability(ffn_dropout, "ffn_dropout")
        self.attn = SimpleAttention(
            d_model, n_head, attention_type=attention_type, pos_dim=pos_dim, norm=norm,
            attn_dropout=dropout if attn_dropout is None else attn_dropout, eps=eps,
            xavier_init=xavier_init, diagonal_weight=diagonal_weight,
            reference_dropout=reference_dropout,
        )
        self.dropout1 = Dropout(dropout)
        self.ffn = FeedForward(d_model, 2 * d_model if dim_feedforward is None else dim_feedforward,
                               activation, dropout if ffn_dropout is None else ffn_dropout)
        self.dropout2 = Dropout(dropout)
        if norm == "layer":  # eps was validated by SimpleAttention
            self.norm1: nn.Module = nn.LayerNorm(d_model, eps=eps)
            self.norm2: nn.Module = nn.LayerNorm(d_model, eps=eps)
        else:
            self.norm1 = self.norm2 = nn.Identity()

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        weight: Tensor | None = None,
        *,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``x (B, N, d_model)``, ``pos (B, N, pos_dim)`` or ``(N, pos_dim)``, ``weight (B, N)``
        or ``(N,)`` → ``(B, N, d_model)`` (and the attention matrix with ``return_attention``,
        see :meth:`SimpleAttention.forward`)."""
        attn = self.attn(x, pos, weight, return_attention=return_attention)
        if return_attention:
            attn, matrix = attn
        x = self.norm1(x + self.dropout1(attn))
        x = self.norm2(x + self.dropout2(self.ffn(x)))
        return (x, matrix) if return_attention else x
