"""BERT encoders (Devlin et al., 2019) as a list of sub-layer operators.

Operators, in order (``n_ops = 2 + 5 * layers``):

* ``embeddings``: word + position + token-type embeddings, LayerNorm; also builds the additive attention mask
  from the ids (id 0 is padding).  ``ids -> (h, mask)``
* per layer ``l{i}``:
  ``l{i}.qkv`` (fused Q/K/V projection ``H -> 3H``) ``(h, mask) -> (qkv, mask, h)``;
  ``l{i}.attn`` (``QK^T/sqrt(d)`` + mask, softmax, ``PV``, all heads) ``-> (ctx, mask, h)``;
  ``l{i}.attn_out`` (output projection, residual add, LayerNorm) ``-> (h1, mask)``;
  ``l{i}.ffn1`` (``H -> 4H`` + GELU) ``-> (f, mask, h1)``;
  ``l{i}.ffn2`` (``4H -> H``, residual add, LayerNorm) ``-> (h2, mask)``
* ``pooler``: tanh(Linear(h[:, 0])) followed by a 2-way classifier -> logits ``[bs, 2]``.

The residual input travels in the carry, so the model can be cut between any two operators.
Full sizes follow the paper's BertBase / BertLarge (bert-base/large-uncased: vocab 30522, 512 positions).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dvasim.model.zoo.base import ZooModel

CONFIGS = {
    # hidden, layers, heads, ffn, vocab, max positions
    "full:bert_base": dict(hidden=768, layers=12, heads=12, ffn=3072, vocab_size=30522, max_position=512),
    "full:bert_large": dict(hidden=1024, layers=24, heads=16, ffn=4096, vocab_size=30522, max_position=512),
    "small:bert_base": dict(hidden=128, layers=2, heads=2, ffn=512, vocab_size=1000, max_position=512),
    "small:bert_large": dict(hidden=192, layers=3, heads=3, ffn=768, vocab_size=1000, max_position=512),
}


class Embeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, max_position: int, eps: float = 1e-12):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position = nn.Embedding(max_position, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, ids: torch.Tensor):
        L = ids.shape[1]
        pos = torch.arange(L, device=ids.device)
        h = self.word(ids) + self.position(pos)[None] + self.token_type.weight[0]
        h = self.norm(h)
        # additive mask [bs, 1, 1, L]: 0 for real tokens, -10000 for padding (id 0), as in BERT.
        mask = (ids == 0).to(h.dtype)[:, None, None, :] * -10000.0
        return h, mask


class QKV(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, 3 * hidden)

    def forward(self, carry):
        h, mask = carry
        return self.proj(h), mask, h


class Attention(nn.Module):
    """Scaled dot-product attention over all heads (two batched GEMMs around a masked softmax)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads

    def forward(self, carry):
        qkv, mask, h = carry
        bs, L, three_h = qkv.shape
        q, k, v = qkv.view(bs, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(bs, L, three_h // 3)
        return ctx, mask, h


class AttnOut(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-12):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, carry):
        ctx, mask, h = carry
        return self.norm(self.proj(ctx) + h), mask


class FFN1(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.proj = nn.Linear(hidden, ffn)

    def forward(self, carry):
        h, mask = carry
        return F.gelu(self.proj(h)), mask, h


class FFN2(nn.Module):
    def __init__(self, hidden: int, ffn: int, eps: float = 1e-12):
        super().__init__()
        self.proj = nn.Linear(ffn, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, carry):
        f, mask, h = carry
        return self.norm(self.proj(f) + h), mask


class Pooler(nn.Module):
    def __init__(self, hidden: int, n_classes: int = 2):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, n_classes)

    def forward(self, carry):
        h, _mask = carry
        return self.classifier(torch.tanh(self.dense(h[:, 0])))


def build_bert(name: str, variant: str) -> ZooModel:
    cfg = dict(CONFIGS[f"{variant}:{name}"])
    H, heads, ffn = cfg["hidden"], cfg["heads"], cfg["ffn"]
    ops: list[tuple[str, nn.Module]] = [("embeddings", Embeddings(cfg["vocab_size"], H, cfg["max_position"]))]
    for i in range(cfg["layers"]):
        ops += [
            (f"l{i}.qkv", QKV(H)),
            (f"l{i}.attn", Attention(H, heads)),
            (f"l{i}.attn_out", AttnOut(H)),
            (f"l{i}.ffn1", FFN1(H, ffn)),
            (f"l{i}.ffn2", FFN2(H, ffn)),
        ]
    ops.append(("pooler", Pooler(H)))
    cfg["default_seq_len"] = 128
    return ZooModel(name=name, variant=variant, input_kind="tokens", ops=ops, config=cfg)
