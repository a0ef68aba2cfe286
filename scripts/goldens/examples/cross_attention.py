"""PyTorch twin of examples/cross_attention.cpp (the second tutorial's Multi_atten, corrected):
one multi-head attention layer with q/k head size 16, v head size 32, 8 heads and an output
projection, run as causal self-attention on x_q and as cross-attention from x_q to a padded x_kv,
plus the input gradients of loss = ½ Σ cross_attention_output² by autograd."""
import math

import torch

from common import randomize_, seeded, write_case

BATCH, QUERY_LEN, KV_LEN, EMBED_DIM, NUM_HEADS = 2, 5, 7, 64, 8
QK_HEAD_DIM, V_HEAD_DIM = 16, 32
KV_LENGTHS = [7, 4]  # valid x_kv tokens per sequence; the rest is padding


class MultiHeadAttention(torch.nn.Module):
    """The tutorial's Multi_atten(emd_size, q_k_size, v_size, head) with its bugs fixed."""

    def __init__(self, emd_size, q_k_size, v_size, head):
        super().__init__()
        self.head = head
        self.q_proj = torch.nn.Linear(emd_size, q_k_size * head)
        self.k_proj = torch.nn.Linear(emd_size, q_k_size * head)
        self.v_proj = torch.nn.Linear(emd_size, v_size * head)
        self.out_proj = torch.nn.Linear(v_size * head, emd_size)

    def forward(self, x_q, x_kv, may_attend):
        """x_q (B, L, E), x_kv (B, S, E), may_attend (B, L, S) with True = the query may see the key."""
        batch, q_len, kv_len = x_q.size(0), x_q.size(1), x_kv.size(1)
        q = self.q_proj(x_q).reshape(batch, q_len, self.head, -1).transpose(1, 2)  # (B, H, L, Dqk)
        k = self.k_proj(x_kv).reshape(batch, kv_len, self.head, -1).transpose(1, 2)  # (B, H, S, Dqk)
        v = self.v_proj(x_kv).reshape(batch, kv_len, self.head, -1).transpose(1, 2)  # (B, H, S, Dv)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, S)
        scores = scores.masked_fill(~may_attend.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads = weights @ v  # (B, H, L, Dv)
        merged = heads.transpose(1, 2).reshape(batch, q_len, -1)  # (B, L, H·Dv)
        return self.out_proj(merged), weights


def causal_mask(batch, length):
    return torch.ones(length, length, dtype=torch.bool).tril().expand(batch, length, length)


def padding_mask(query_len, key_len, lengths):
    valid_key = torch.arange(key_len)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    return valid_key[:, None, :].expand(len(lengths), query_len, key_len)


def run(model, inputs):
    x_q = inputs["x_q"].clone().requires_grad_()
    x_kv = inputs["x_kv"].clone().requires_grad_()
    self_output, _ = model(x_q, x_q, causal_mask(BATCH, QUERY_LEN))
    cross_output, cross_weights = model(x_q, x_kv, padding_mask(QUERY_LEN, KV_LEN, KV_LENGTHS))
    loss = 0.5 * cross_output.pow(2).sum()
    grad_x_q, grad_x_kv = torch.autograd.grad(loss, [x_q, x_kv])
    return {"self_attention_output": self_output, "cross_attention_output": cross_output,
            "cross_attention_weights": cross_weights, "grad_x_q": grad_x_q, "grad_x_kv": grad_x_kv}


def main():
    gen = seeded("cross_attention")
    model = MultiHeadAttention(EMBED_DIM, QK_HEAD_DIM, V_HEAD_DIM, NUM_HEADS)
    randomize_(model, gen)
    inputs = {"x_q": torch.rand(BATCH, QUERY_LEN, EMBED_DIM, generator=gen),
              "x_kv": torch.rand(BATCH, KV_LEN, EMBED_DIM, generator=gen)}
    write_case("cross_attention", "cross_attention", "", model, inputs, run,
               "self- and cross-attention with q/k head size 16, v head size 32, 8 heads, out_proj, "
               "a (B, L, S) mask, and input gradients")


if __name__ == "__main__":
    main()
