// The context-parallel call's checks: this rank's arguments, then that every rank makes the same
// call.
#include "call.h"

#include <bit>
#include <charconv>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mha::distributed::detail {
namespace {

void check_rank4(const Shape& s, const char* name, const char* layout) {
  check(s.size() == 4, name, ": expected a 4-D tensor ", layout, ", got shape ", s);
}

template <class M>
void check_mask(const View<const M>& mask, const Call& c, const char* name) {
  if (!mask.defined()) return;
  const Shape full{c.batch, c.query_heads, c.query_len, c.key_len};
  bool ok = mask.dim() >= 1 && mask.dim() <= 4;
  for (int64_t a = 0; ok && a < mask.dim(); ++a) {
    const int64_t want = full[static_cast<size_t>(4 - mask.dim() + a)];
    ok = mask.size(a) == want || mask.size(a) == 1;
  }
  check(ok, "options.", name, ": expected a mask broadcastable to the whole call's (B, Hq, L, S) = ", full, ", got ",
        mask.shape());
}

// A field every rank must agree on: its name, and whether its 64 bits are a double's.
struct Field {
  std::string name;
  bool is_double = false;
};

// Appends every field of a settings struct (its visit_fields list; nested structs by their own)
// as a name and 64 bits: integers and enums as they are, doubles by their bits, an optional as
// its value's bits or a NaN's.
template <class Settings>
void encode_fields(const Settings& settings, std::vector<Field>& fields, std::vector<int64_t>& values) {
  attention::for_each_field(settings, [&](const std::string& name, const auto& value) {
    using V = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<V, double>) {
      values.push_back(std::bit_cast<int64_t>(value));
    } else if constexpr (std::is_same_v<V, std::optional<double>>) {
      values.push_back(std::bit_cast<int64_t>(value.value_or(std::numeric_limits<double>::quiet_NaN())));
    } else {
      values.push_back(static_cast<int64_t>(value));
    }
    fields.push_back({name, std::is_same_v<V, double> || std::is_same_v<V, std::optional<double>>});
  });
}

// A field's 64 bits as the value they hold (a double in the fewest digits that give it back).
std::string shown(const Field& field, int64_t bits) {
  if (!field.is_double) return std::to_string(bits);
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, std::bit_cast<double>(bits)).ptr);
}

}  // namespace

template <class T>
Call make_call(Communicator& comm, Scheme scheme, const char* function, const Tensor<T>& q, const Tensor<T>& k,
               const Tensor<T>& v, const Sequence& seq, const attention::Options<T>& options) {
  check_rank4(q.shape(), "query", "(B, Hq, Nq, Dqk)");
  check_rank4(k.shape(), "key", "(B, Hkv, Nk, Dqk)");
  check_rank4(v.shape(), "value", "(B, Hkv, Nk, Dv)");
  Call c;
  c.batch = q.size(0);
  c.query_heads = q.size(1);
  c.kv_heads = k.size(1);
  c.qk_dim = q.size(3);
  c.v_dim = v.size(3);
  c.query_len = seq.query_len;
  c.key_len = seq.key_len;
  c.layout = seq.layout;
  c.rank = comm.rank();
  c.ranks = comm.size();
  check(c.query_len >= 0 && c.key_len >= 0, "sequence: expected lengths >= 0, got ", c.query_len, " queries and ",
        c.key_len, " keys");
  check(c.kv_heads > 0 && c.query_heads % c.kv_heads == 0, "key: number of key/value heads must divide the ",
        c.query_heads, " query heads (grouped-query attention), got ", c.kv_heads);
  const int64_t nq = c.query_rows(c.rank), nk = c.key_rows(c.rank);
  check(q.size(2) == nq, "query: expected rank ", c.rank, "'s ", nq, " of the ", c.query_len, " query rows, got ",
        q.shape());
  check_shape(k.shape(), {c.batch, c.kv_heads, nk, c.qk_dim}, "key");
  check_shape(v.shape(), {c.batch, c.kv_heads, nk, c.v_dim}, "value");
  check(!options.need_weights, "options.need_weights: context-parallel attention does not return the weights");
  const attention::WholeCall& pos = options.whole_call;
  check(pos.query_offset == 0 && pos.key_offset == 0 && pos.head_offset == 0 && pos.query_len == 0 &&
            pos.key_len == 0 && pos.heads == 0,
        "options.whole_call: expected the default (context-parallel attention sets it)");
  check_mask(options.attend_mask, c, "attend_mask");
  check_mask(options.additive_mask, c, "additive_mask");

  // Of the typed views (their one list), the masks alone: not yet per-sequence lengths or starts,
  // packed sequences, sinks or ALiBi slopes.
  attention::Options<T>::visit_views([&](std::string_view name, auto member) {
    check(name == "attend_mask" || name == "additive_mask" || !(options.*member).defined(), "options.", name,
          ": context-parallel attention takes no typed view but the masks yet, got ", name);
  });

  // What every rank must agree on: the call's shape and kind, then every Scoring field (its one
  // list, Scoring::visit_fields), each as 64 bits.
  std::vector<Field> fields{{"scheme"},          {"layout"},      {"batch"},       {"query heads"},
                            {"kv heads"},        {"query head size"}, {"value head size"}, {"query length"},
                            {"key length"},      {"attend_mask"}, {"additive_mask"}, {"dtype"}};
  std::vector<int64_t> mine{static_cast<int64_t>(scheme), static_cast<int64_t>(seq.layout), c.batch, c.query_heads,
                            c.kv_heads, c.qk_dim, c.v_dim, c.query_len, c.key_len,
                            options.attend_mask.defined() ? 1 : 0, options.additive_mask.defined() ? 1 : 0,
                            static_cast<int64_t>(sizeof(T))};
  encode_fields(static_cast<const attention::Scoring&>(options), fields, mine);
  const size_t n = mine.size();
  const std::vector<int64_t> all = comm.all_gather(std::span<const int64_t>(mine));
  for (int r = 1; r < c.ranks; ++r)
    for (size_t f = 0; f < n; ++f)
      check(all[static_cast<size_t>(r) * n + f] == all[f], function, ": every rank must make the same call, but rank ",
            r, "'s ", fields[f].name, " (", shown(fields[f], all[static_cast<size_t>(r) * n + f]), ") differs from rank 0's (",
            shown(fields[f], all[f]), ")");
  return c;
}

template Call make_call(Communicator&, Scheme, const char*, const Tensor<float>&, const Tensor<float>&,
                        const Tensor<float>&, const Sequence&, const attention::Options<float>&);
template Call make_call(Communicator&, Scheme, const char*, const Tensor<double>&, const Tensor<double>&,
                        const Tensor<double>&, const Sequence&, const attention::Options<double>&);

}  // namespace mha::distributed::detail
