"""Train a tiny two-layer transformer whose attention is an attncc kernel, beside the same
model on PyTorch's SDPA, and check that the two loss curves agree.

The attention is examples/alibi.attn (causal, ALiBi) with each layer's slopes a learnable
``nn.Parameter`` of shape [H]: the kernel's backward returns their gradient with dq, dk and
dv. The SDPA model builds the same bias in torch (``-slopes[h] * (m - n)``, -inf above the
diagonal) from its own learnable slopes. Both start from the same weights and see the same
batches of random tokens (a fixed set, so the loss can fall by memorising them), in float32.

On the CPU the kernel runs in the Triton interpreter: ``python examples/train_tiny.py``
(``--steps N``, default 50) prints both curves and the time taken. The interpreter makes it
slow: 50 steps took 75 s of user CPU time (each step runs two layers' forward,
~0.15 s, and backward, ~0.4 s; Triton's interpreter checks every int32 index operation for
overflow, ~40% of a backward's time). tests/test_train_tiny.py runs 12 steps.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import attncc

SPEC = Path(__file__).resolve().parent / "alibi.attn"
VOCAB, D_MODEL, HEADS, SEQ, BATCH = 64, 32, 2, 16, 4
BATCHES = 4  # distinct batches, cycled: random tokens are learnable only by memorising
LR = 3e-3
# per-step agreement of the two losses: float32 models that differ only in the order of their
# roundings stay within ~1e-6 of each other over 50 steps (measured max 3e-7 rel)
LOSS_RTOL = 1e-3

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_alibi(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor
) -> torch.Tensor:
    """examples/alibi.attn in torch: SDPA with an additive causal ALiBi bias."""
    m = torch.arange(q.shape[-2], device=q.device)[:, None]
    n = torch.arange(k.shape[-2], device=q.device)[None, :]
    bias = -slopes[:, None, None] * (m - n).to(q.dtype)
    bias = bias.masked_fill(m < n, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class Block(nn.Module):
    def __init__(self, attention: Attention) -> None:
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.mlp = nn.Sequential(
            nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL)
        )
        # ALiBi's geometric slopes, 2^(-8 h / H), as the starting point; learnt from there
        self.slopes = nn.Parameter(2.0 ** (-8.0 * torch.arange(1, HEADS + 1) / HEADS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, seq, 3, HEADS, D_MODEL // HEADS)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, S, D], strided views
        o = self.attention(q, k, v, self.slopes)
        x = x + self.proj(o.transpose(1, 2).reshape(batch, seq, D_MODEL))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, attention: Attention) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.ModuleList([Block(attention), Block(attention)])
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def use_attention(model: TinyTransformer, attention: Attention) -> TinyTransformer:
    for block in model.blocks:
        block.attention = attention  # type: ignore[union-attr]
    return model


def train(model: TinyTransformer, data: torch.Tensor, steps: int) -> list[float]:
    """Next-token cross-entropy, Adam; the loss of every step."""
    optimiser = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        tokens = data[step % len(data)]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def main(steps: int = 50, seed: int = 0) -> tuple[list[float], list[float]]:
    """Train both models ``steps`` steps; returns (attncc losses, SDPA losses).
    AssertionError unless both learnt the same ALiBi slopes (``LOSS_RTOL``, relative): a
    wrong slope gradient moves the loss too little to show in a few steps."""
    torch.manual_seed(seed)
    kernel = attncc.compile(SPEC, target="triton", schedule="fused")
    gen = torch.Generator().manual_seed(seed)
    # SEQ + 1 tokens: the model reads SEQ of them and predicts each next one
    data = torch.randint(0, VOCAB, (BATCHES, BATCH, SEQ + 1), generator=gen)
    reference = TinyTransformer(sdpa_alibi)
    ours = use_attention(copy.deepcopy(reference), kernel)
    losses = train(ours, data, steps), train(reference, data, steps)
    for mine, theirs in zip(ours.blocks, reference.blocks, strict=True):
        learnt, expected = mine.slopes.detach(), theirs.slopes.detach()  # type: ignore[union-attr]
        worst = ((learnt - expected).abs() / expected.abs()).max().item()
        assert worst <= LOSS_RTOL, f"learnt slopes differ by {worst:.2e} (relative)"
    return losses


def agree(ours: list[float], theirs: list[float], rtol: float = LOSS_RTOL) -> float:
    """The largest relative difference of the two curves; AssertionError above ``rtol``."""
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs, strict=True))
    assert worst <= rtol, f"loss curves differ by {worst:.2e} (relative) > {rtol:.0e}"
    return worst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    start = time.perf_counter()
    ours, theirs = main(args.steps)
    seconds = time.perf_counter() - start
    for step in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {step:3d}  attncc {ours[step]:.6f}  sdpa {theirs[step]:.6f}")
    worst = agree(ours, theirs)
    assert ours[-1] < ours[0] - 0.1 * math.log(VOCAB), "the loss did not fall"
    print(f"loss {ours[0]:.4f} -> {ours[-1]:.4f}; curves agree to {worst:.1e} rel; {seconds:.1f} s")
