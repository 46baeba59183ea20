"""A tiny character-level transformer on ``corpus.txt`` (written for this repository, public domain).

Architecture: token embedding + learned positions, one pre-LayerNorm block (causal multi-head
self-attention, GELU MLP), final LayerNorm, linear head. The causal mask is a frozen buffer
(state carried unchanged). Exported with fixed shapes (batch, context) so every node is static.
AdamW with weight decay; next-character cross-entropy over every position.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verde_chain.graph.data import Dataset
from verde_chain.graph.onnx_import import export_torch
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import Job, make_job

CORPUS = Path(__file__).with_name("corpus.txt")


def corpus_tokens() -> tuple[np.ndarray, str]:
    text = " ".join(CORPUS.read_text().split())
    vocab = "".join(sorted(set(text)))
    ids = np.array([vocab.index(c) for c in text], dtype=np.int64)
    return ids, vocab


def corpus_dataset(context: int) -> tuple[Dataset, str]:
    """Non-overlapping windows: X = ids[i*L : i*L+L], Y = ids[i*L+1 : i*L+L+1]."""
    ids, vocab = corpus_tokens()
    n = (len(ids) - 1) // context
    X = np.stack([ids[i * context : i * context + context] for i in range(n)]).astype(np.float32)
    Y = np.stack([ids[i * context + 1 : i * context + context + 1] for i in range(n)]).astype(np.float32)
    return Dataset(X, Y, "tokens"), vocab


def tiny_transformer(vocab: int, context: int, batch: int, dim: int = 32, heads: int = 2, seed: int = 0):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.proj = nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
            self.act = nn.GELU()
            self.scale = float(1.0 / np.sqrt(dim // heads))
            mask = torch.triu(torch.full((context, context), -1e9), diagonal=1)
            self.register_buffer("mask", mask)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hd = dim // heads
            h = self.ln1(x)
            q, k, v = self.q(h), self.k(h), self.v(h)
            q = q.reshape(batch, context, heads, hd).transpose(1, 2)
            k = k.reshape(batch, context, heads, hd).transpose(1, 2)
            v = v.reshape(batch, context, heads, hd).transpose(1, 2)
            att = (q @ k.transpose(-1, -2)) * self.scale + self.mask
            y = att.softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(batch, context, dim))
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.randn(context, dim) * 0.1)
            self.block = Block()
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.ln(self.block(self.tok(tokens) + self.pos)))

    torch.manual_seed(seed)
    return Tiny()


def transformer_job(steps: int = 60, batch_size: int = 8, context: int = 16, dim: int = 32, heads: int = 2,
                    lr: float = 3e-3, checkpoint_interval: int = 20, seed: int = 11) -> Job:
    import torch

    data, vocab = corpus_dataset(context)
    module = tiny_transformer(len(vocab), context, batch_size, dim, heads)
    onnx_bytes = export_torch(module, torch.zeros(batch_size, context, dtype=torch.long), ["tokens"])
    frozen = tuple(name for name, _ in module.named_buffers())
    return make_job(
        "tiny-transformer", onnx_bytes, data, LossSpec("cross_entropy"),
        OptimizerSpec("adamw", lr=lr, weight_decay=0.01), steps, batch_size, seed, checkpoint_interval, frozen,
    )
