// Semantic search with a real pretrained sentence encoder: all-MiniLM-L6-v2 (from
// sentence-transformers, loaded from its Hugging Face directory) embeds a small corpus and a few
// queries; each query's sentences are ranked by cosine similarity (the embeddings are normalised,
// so a dot product). The whole model runs in mha: WordPiece tokenizer, BERT encoder (6 layers of
// mha's TransformerEncoderLayer, attention by mha's MultiheadAttention), mean pooling.
//
//   semantic_search [--model DIR] [--top K]
//
// It checks its own answer: each query's best match must be the sentence it was written for
// (exit 1 otherwise).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "mha/core/error.h"
#include "mha/core/escape.h"
#include "mha/models/sentence_encoder.h"

namespace {

const std::vector<std::string> kCorpus = {
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "A cheetah is running behind its prey.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "Stock prices fell sharply after the announcement.",
};

struct Query {
  std::string text;
  size_t expected;  // index in kCorpus of the sentence it was written for
};

const std::vector<Query> kQueries = {
    {"Someone is having a meal.", 0},
    {"A person rides an animal in a field.", 6},
    {"A cheetah chases its prey across the savanna.", 8},
    {"The film was great!", 9},
    {"Shares dropped on the market.", 11},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Rank a small corpus against queries with all-MiniLM-L6-v2, run by mha"};
  std::string model_dir = MHA_DEFAULT_MODEL_DIR;
  size_t top = 3;
  std::string dtype = "float32";
  app.add_option("--model", model_dir, "sentence-transformers model directory")->capture_default_str();
  app.add_option("--dtype", dtype, "the type the encoder computes in: float32 or bfloat16")->capture_default_str();
  app.add_option("--top", top, "matches shown per query")->capture_default_str()->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const mha::models::SentenceEncoder encoder(model_dir, mha::models::dtype_from_name(dtype, "--dtype"));
    std::printf("model %s: %lld-dimensional embeddings, up to %lld tokens per sentence, computed in %s\n",
                mha::escape(model_dir).c_str(), static_cast<long long>(encoder.dimension()),
                static_cast<long long>(encoder.max_seq_length()), mha::models::dtype_name(encoder.dtype()));
    const mha::Tensor<float> corpus = encoder.encode(kCorpus);
    std::vector<std::string> query_texts;
    for (const auto& q : kQueries) query_texts.push_back(q.text);
    const mha::Tensor<float> queries = encoder.encode(query_texts);
    const int64_t dim = encoder.dimension();
    int wrong = 0;
    for (size_t q = 0; q < kQueries.size(); ++q) {
      std::vector<double> score(kCorpus.size());
      for (size_t c = 0; c < kCorpus.size(); ++c) {
        double dot = 0;
        for (int64_t h = 0; h < dim; ++h)
          dot += static_cast<double>(queries[static_cast<int64_t>(q) * dim + h]) * corpus[static_cast<int64_t>(c) * dim + h];
        score[c] = dot;
      }
      std::vector<size_t> order(kCorpus.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
      std::printf("\nquery: %s\n", kQueries[q].text.c_str());
      for (size_t i = 0; i < std::min(top, order.size()); ++i)
        std::printf("  %.4f  %s\n", score[order[i]], kCorpus[order[i]].c_str());
      if (order[0] != kQueries[q].expected) {
        std::printf("  MISMATCH: expected the best match to be \"%s\"\n", kCorpus[kQueries[q].expected].c_str());
        ++wrong;
      }
    }
    std::printf("\n%s\n", wrong == 0 ? "every query found the sentence it was written for"
                                     : "some queries did not find their sentence");
    return wrong == 0 ? 0 : 1;
  } catch (const mha::Error& e) {
    std::fprintf(stderr, "semantic_search: %s\n", mha::escape(e.what(), true).c_str());
    return 1;
  }
}
