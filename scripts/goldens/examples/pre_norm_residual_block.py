"""PyTorch twin of examples/pre_norm_residual_block.cpp: tutorial 001's MultiHead block with its
mistakes fixed,

    out = Q + Dropout(out_fc(attention(fc_Q(LN(Q)), fc_K(LN(K)), fc_V(LN(V)), mask)))

32-wide, 4 heads, 50 tokens, batch 2, the last 10 tokens of the second sequence padded. Run in
eval mode (dropout is the identity); the results are the output and the gradients of
sum(out * grad_output) for query, key, value and every parameter."""
import math

import torch

from common import randomize_, seeded, write_case

BATCH, SEQ_LEN, EMBED_DIM, NUM_HEADS, PADDED = 2, 50, 32, 4, 10


def attention(q, k, v, is_padding):
    """q (N, H, L, d), k and v (N, H, S, d); is_padding (N, S), True = may not be attended to."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # sqrt(head_dim), a Python float
    scores = scores.masked_fill(is_padding[:, None, None, :], float("-inf"))  # out of place: assigned
    return torch.softmax(scores, dim=-1) @ v


class MultiHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_Q = torch.nn.Linear(EMBED_DIM, EMBED_DIM)
        self.fc_K = torch.nn.Linear(EMBED_DIM, EMBED_DIM)
        self.fc_V = torch.nn.Linear(EMBED_DIM, EMBED_DIM)
        self.out_fc = torch.nn.Linear(EMBED_DIM, EMBED_DIM)
        self.norm = torch.nn.LayerNorm(EMBED_DIM, elementwise_affine=True)
        self.dropout = torch.nn.Dropout(p=0.1)

    def forward(self, Q, K, V, is_padding):
        def split(x):  # (N, L, E) -> (N, H, L, d), no hard-coded length
            return x.reshape(x.size(0), x.size(1), NUM_HEADS, -1).transpose(1, 2)

        q = split(self.fc_Q(self.norm(Q)))
        k = split(self.fc_K(self.norm(K)))
        v = split(self.fc_V(self.norm(V)))
        heads = attention(q, k, v, is_padding)
        merged = heads.transpose(1, 2).reshape(Q.size(0), Q.size(1), EMBED_DIM)
        return Q + self.dropout(self.out_fc(merged))  # the residual adds the raw Q


def run(model, inputs):
    query, key, value = (inputs[name].clone().requires_grad_(True) for name in ("query", "key", "value"))
    out = model(query, key, value, inputs["key_padding_mask"])
    (out * inputs["grad_output"]).sum().backward()
    results = {"output": out, "grad_query": query.grad, "grad_key": key.grad, "grad_value": value.grad}
    results.update({f"grad.{name}": p.grad for name, p in model.named_parameters()})
    return results


def main():
    gen = seeded("pre_norm_residual_block")
    model = MultiHead()
    randomize_(model, gen)
    shape = (BATCH, SEQ_LEN, EMBED_DIM)
    is_padding = torch.zeros(BATCH, SEQ_LEN, dtype=torch.bool)
    is_padding[-1, SEQ_LEN - PADDED:] = True
    inputs = {name: torch.randn(shape, generator=gen) for name in ("query", "key", "value", "grad_output")}
    inputs["key_padding_mask"] = is_padding

    # The same block through nn.MultiheadAttention (packed in_proj = fc_Q; fc_K; fc_V): one projection
    # split into heads is the paper's per-head projections, and MHA's mask polarity is the same.
    mha = torch.nn.MultiheadAttention(EMBED_DIM, NUM_HEADS, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([model.fc_Q.weight, model.fc_K.weight, model.fc_V.weight]))
        mha.in_proj_bias.copy_(torch.cat([model.fc_Q.bias, model.fc_K.bias, model.fc_V.bias]))
        mha.out_proj.load_state_dict(model.out_fc.state_dict())
        norm = model.norm
        via_mha = inputs["query"] + mha(norm(inputs["query"]), norm(inputs["key"]), norm(inputs["value"]),
                                        key_padding_mask=is_padding, need_weights=False)[0]
        direct = model.eval()(inputs["query"], inputs["key"], inputs["value"], is_padding)
        assert torch.allclose(via_mha, direct, atol=1e-5), (via_mha - direct).abs().max()

    write_case("pre_norm_residual_block", "pre_norm_residual_block", "", model, inputs, run,
               "the tutorial's pre-norm residual MHA block (separate Q, K, V, padding mask), forward and backward")


if __name__ == "__main__":
    main()
