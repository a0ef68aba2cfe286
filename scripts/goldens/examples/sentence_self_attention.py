"""PyTorch twin of examples/sentence_self_attention.cpp (the first tutorial, done right):
the padded sentence through nn.Embedding(6, 512, padding_idx=0) and
nn.MultiheadAttention(512, 8, batch_first=True) with the padding masked out of the keys."""
import torch

from common import randomize_, seeded, write_case

VOCAB = {"this": 1, "is": 2, "an": 3, "example": 4, "sentence": 5}


class SentenceModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(6, 512, padding_idx=0)
        self.attention = torch.nn.MultiheadAttention(512, 8, batch_first=True)


def run(model, _inputs):
    ids = [VOCAB.get(w, 0) for w in "this is an example sentence".split()]
    tokens = torch.tensor([ids + [0] * (10 - len(ids))])
    x = model.embedding(tokens)
    out, weights = model.attention(x, x, x, key_padding_mask=tokens == 0, average_attn_weights=False)
    return {"embedded": x, "output": out, "attn_weights": weights}


def main():
    model = SentenceModel()
    randomize_(model, seeded("sentence_self_attention"))
    with torch.no_grad():
        model.embedding.weight[0].zero_()  # the padding row, as nn.Embedding keeps it
    write_case("sentence_self_attention", "sentence_self_attention", "", model, {}, run,
               "the padded tutorial sentence through a 512-wide embedding and 8-head self-attention")


if __name__ == "__main__":
    main()
