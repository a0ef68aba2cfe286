"""PyTorch twin of examples/attention_levels.cpp (the third tutorial's four levels, corrected):
V1 separate q/k/v projections, V2 one fused projection holding V1's weights, V3 with an
attention_mask and attention dropout (eval mode here: dropout off), V4 multi-head with a
(batch, seq, seq) mask, scale 1/sqrt(head_dim) and the output projection applied."""
import math

import torch
from torch import nn

from common import randomize_, seeded, write_case

BATCH, SEQ_LEN, HIDDEN, LENGTHS = 3, 4, 16, [3, 2, 1]
MULTI_BATCH, MULTI_SEQ_LEN, MULTI_HIDDEN, NUM_HEADS, MULTI_LENGTHS = 2, 8, 64, 8, [8, 5]
DROPOUT = 0.1


class SelfAttentionV1(nn.Module):
    def __init__(self, hidden_dim):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.query_proj = nn.Linear(hidden_dim, hidden_dim)
        self.key_proj = nn.Linear(hidden_dim, hidden_dim)
        self.value_proj = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x):
        q, k, v = self.query_proj(x), self.key_proj(x), self.value_proj(x)
        # One head of size hidden_dim, so sqrt(hidden_dim) is the head size here.
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.hidden_dim), dim=-1)
        return weights @ v


class SelfAttentionV2(nn.Module):
    def __init__(self, hidden_dim, dtype=None):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.proj = nn.Linear(hidden_dim, hidden_dim * 3, dtype=dtype)

    @classmethod
    def fused_from(cls, v1):
        """The fused layer with V1's query, key and value weights stacked as its row blocks."""
        v2 = cls(v1.hidden_dim, dtype=v1.query_proj.weight.dtype)
        with torch.no_grad():
            v2.proj.weight.copy_(torch.cat([v1.query_proj.weight, v1.key_proj.weight, v1.value_proj.weight]))
            v2.proj.bias.copy_(torch.cat([v1.query_proj.bias, v1.key_proj.bias, v1.value_proj.bias]))
        return v2

    def forward(self, x):
        q, k, v = torch.split(self.proj(x), self.hidden_dim, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.hidden_dim), dim=-1)
        return weights @ v


class SelfAttentionV3(nn.Module):
    def __init__(self, hidden_dim, dropout_rate):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.proj = nn.Linear(hidden_dim, hidden_dim * 3)
        self.attention_dropout = nn.Dropout(dropout_rate)

    def forward(self, x, attention_mask):  # attention_mask (B, L, L), 0 = blocked
        q, k, v = torch.split(self.proj(x), self.hidden_dim, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hidden_dim)
        scores = scores.masked_fill(attention_mask == 0, float("-inf"))
        weights = self.attention_dropout(torch.softmax(scores, dim=-1))  # identity in eval()
        return weights @ v


class SelfAttentionV4(nn.Module):
    def __init__(self, hidden_dim, num_heads, dropout_rate):
        super().__init__()
        self.hidden_dim, self.num_heads = hidden_dim, num_heads
        self.head_dim = hidden_dim // num_heads
        self.proj = nn.Linear(hidden_dim, hidden_dim * 3)
        self.out_proj = nn.Linear(hidden_dim, hidden_dim)
        self.attention_dropout = nn.Dropout(dropout_rate)

    def forward(self, x, attention_mask):  # attention_mask (B, L, L), 0 = blocked
        batch, seq_len, _ = x.shape
        q, k, v = torch.split(self.proj(x), self.hidden_dim, dim=-1)
        q, k, v = (t.view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # per-head dot products
        scores = scores.masked_fill(attention_mask.unsqueeze(1) == 0, float("-inf"))
        weights = self.attention_dropout(torch.softmax(scores, dim=-1))
        merged = (weights @ v).transpose(1, 2).contiguous().view(batch, seq_len, self.hidden_dim)
        return self.out_proj(merged)


class AttentionLevels(nn.Module):
    """The levels with weights of their own (V2 is built from V1)."""

    def __init__(self):
        super().__init__()
        self.v1 = SelfAttentionV1(HIDDEN)
        self.v3 = SelfAttentionV3(HIDDEN, DROPOUT)
        self.v4 = SelfAttentionV4(MULTI_HIDDEN, NUM_HEADS, DROPOUT)


def padding_attention_mask(seq_len, lengths):
    """The tutorial's (B, L) mask of 1 = token, 0 = padding, repeated to (B, L, L)."""
    mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    return mask.unsqueeze(1).repeat(1, seq_len, 1)


def run(model, inputs):
    x, x_multihead = inputs["x"], inputs["x_multihead"]
    v2 = SelfAttentionV2.fused_from(model.v1)
    return {"v1_output": model.v1(x), "v2_output": v2(x),
            "v3_output_eval": model.v3(x, padding_attention_mask(SEQ_LEN, LENGTHS)),
            "v4_output": model.v4(x_multihead, padding_attention_mask(MULTI_SEQ_LEN, MULTI_LENGTHS))}


def main():
    gen = seeded("attention_levels")
    model = AttentionLevels()
    randomize_(model, gen)
    inputs = {"x": torch.randn(BATCH, SEQ_LEN, HIDDEN, generator=gen),
              "x_multihead": torch.randn(MULTI_BATCH, MULTI_SEQ_LEN, MULTI_HIDDEN, generator=gen)}
    write_case("attention_levels", "attention_levels", "", model, inputs, run,
               "the four levels of self-attention: separate and fused projections, attention_mask with "
               "dropout (eval), and 8-head attention with a (B, L, L) mask")


if __name__ == "__main__":
    main()
