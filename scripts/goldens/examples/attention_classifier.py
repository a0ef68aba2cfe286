"""PyTorch twin of examples/attention_classifier.cpp: tutorial 002's models with their mistakes
fixed, on 4 random 28x28 "images" read as 28 tokens of 28 features:

    single_head  SelfAttention: softmax(q k^T / sqrt(d_kq)) v, d_kq = embed_dim = 28
    classifier   x + MultiheadAttention(28, 4 heads)(x, x, x) -> mean over positions -> fc1 (128)
                 -> ReLU -> fc2 (10 logits)

The classifier's attention is nn.MultiheadAttention (mha's names); main() checks that it is the
tutorial's MultiHeadSelfAttention (query/key/value/fc layers) with the weights mapped."""
import math

import torch

from common import randomize_, seeded, write_case

BATCH, IMAGE_SIZE, NUM_HEADS, HIDDEN_DIM, NUM_CLASSES = 4, 28, 4, 128, 10


class SelfAttention(torch.nn.Module):
    def __init__(self, embed_dim):
        super().__init__()
        self.d_kq = embed_dim
        self.K = torch.nn.Linear(embed_dim, embed_dim)
        self.Q = torch.nn.Linear(embed_dim, embed_dim)
        self.V = torch.nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        key, query, value = self.K(x), self.Q(x), self.V(x)
        # key.transpose(-2, -1), not key.T (which reverses all dims of a 3-D tensor);
        # math.sqrt of the int, not torch.sqrt (which needs a tensor).
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.d_kq)
        return torch.softmax(scores, dim=-1) @ value


class MultiHeadSelfAttention(torch.nn.Module):
    """The tutorial's module (its multi-head code is right), kept to check the weight mapping."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.query = torch.nn.Linear(embed_dim, embed_dim)
        self.key = torch.nn.Linear(embed_dim, embed_dim)
        self.value = torch.nn.Linear(embed_dim, embed_dim)
        self.fc = torch.nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        n, length, embed_dim = x.size()

        def split(t):
            return t.view(n, length, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)
        attended = (weights @ v).transpose(1, 2).contiguous().view(n, length, embed_dim)
        return self.fc(attended) + x


class MultiHeadSelfAttentionClassifier(torch.nn.Module):
    def __init__(self, embed_dim, num_heads, hidden_dim, num_classes):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.fc1 = torch.nn.Linear(embed_dim, hidden_dim)
        self.fc2 = torch.nn.Linear(hidden_dim, num_classes)

    def forward(self, x):
        attended = x + self.attention(x, x, x, need_weights=False)[0]
        logits = self.fc2(torch.relu(self.fc1(attended.mean(dim=1))))
        return attended, logits


class TutorialModels(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.single_head = SelfAttention(IMAGE_SIZE)
        self.classifier = MultiHeadSelfAttentionClassifier(IMAGE_SIZE, NUM_HEADS, HIDDEN_DIM, NUM_CLASSES)


def run(model, inputs):
    images = inputs["images"]
    attended, logits = model.classifier(images)
    return {"single_head_output": model.single_head(images), "attention_output": attended, "logits": logits}


def check_tutorial_mapping(model, images):
    """nn.MultiheadAttention + residual is the tutorial's MultiHeadSelfAttention with
    query/key/value = the q/k/v row blocks of in_proj and fc = out_proj."""
    mha = model.classifier.attention
    tutorial = MultiHeadSelfAttention(IMAGE_SIZE, NUM_HEADS)
    with torch.no_grad():
        for layer, w, b in zip((tutorial.query, tutorial.key, tutorial.value), mha.in_proj_weight.chunk(3),
                               mha.in_proj_bias.chunk(3)):
            layer.weight.copy_(w)
            layer.bias.copy_(b)
        tutorial.fc.load_state_dict(mha.out_proj.state_dict())
        ours, _ = model.eval().classifier(images)
        assert torch.allclose(tutorial(images), ours, atol=1e-5), (tutorial(images) - ours).abs().max()


def main():
    gen = seeded("attention_classifier")
    model = TutorialModels()
    randomize_(model, gen)
    images = torch.rand(BATCH, IMAGE_SIZE, IMAGE_SIZE, generator=gen)  # pixel intensities in [0, 1)
    check_tutorial_mapping(model, images)
    write_case("attention_classifier", "attention_classifier", "", model, {"images": images}, run,
               "the tutorial's single-head self-attention and MHSA classifier on 4 random 28x28 images")


if __name__ == "__main__":
    main()
