#include "attention_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend_option.h"
#include "number_flags.h"
#include "mha/core/safetensors.h"
#include "mha/nn/multihead_attention.h"
#include "mha/nn/serialization.h"
#if MHA_WITH_MPI
#include "mha/distributed/context_parallel.h"
#include "rank_agreement.h"
#endif

namespace mha::tools {
namespace {

namespace st = mha::safetensors;

struct AttentionArgs {
  std::string weights_path, inputs_path, output_path;
  std::string dtype = "float32";
  std::string backend = "automatic";
  nn::MultiheadAttentionOptions module;
  int64_t kdim = 0, vdim = 0;  // 0 = not given: embed_dim, as PyTorch's None
  bool need_weights = true, average_attn_weights = true, is_causal = false;
  bool train = false, backward = false, timings = false;
  uint64_t seed = 0;
  std::string context_parallel, layout = "contiguous";  // --context-parallel ring|ulysses (under mpirun)
  std::vector<int64_t> window;                              // --window LEFT,RIGHT
};

// Wall-clock time of each stage of the command, printed with --timings.
class StageTimer {
 public:
  void stage(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    times_.emplace_back(name, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  std::string report() const {
    std::string out = "mha attention: stage times:";
    double total = 0;
    for (const auto& [name, ms] : times_) {
      out += detail::concat(" ", name, " ", std::lround(ms * 10) / 10.0, " ms;");
      total += ms;
    }
    return out + detail::concat(" total ", std::lround(total * 10) / 10.0, " ms\n");
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::vector<std::pair<const char*, double>> times_;
};

}  // namespace

const char* attention_contract() {
  return R"(
Tensor names (a documented contract; shapes and layouts exactly as PyTorch's for the same flags):
  --weights file:  PyTorch state_dict names: in_proj_weight (3E, E), or q_proj_weight (E, E),
                   k_proj_weight (E, kdim), v_proj_weight (E, vdim) when kdim/vdim differ;
                   in_proj_bias (3E), bias_k, bias_v (1, 1, E), out_proj.weight (E, E),
                   out_proj.bias (E). Without --weights the module is initialised from --seed
                   as PyTorch initialises it.
  --inputs file:   query; key and value (default: query, i.e. self-attention);
                   key_padding_mask, attn_mask (BOOL: True = may not attend; float: added);
                   sinks (num_heads): one sink logit per head (gpt-oss); alibi_slopes
                   (num_heads) or (N, num_heads): ALiBi;
                   grad_output (required with --backward); any other name is an error.
                   Layout (L, N, E), (N, L, E) with --batch-first, (L, E) unbatched.
  --output file:   output; attn_weights (with --need-weights); with --backward: grad_query,
                   grad_key, grad_value, grad_sinks (with sinks) and grad.<parameter name>
                   (e.g. grad.in_proj_weight).
Float tensors of any float dtype are read (converted to --dtype, rounded once; a tensor already of
that dtype is taken as it is); results are written in --dtype: F32, F64, BF16 or F16. bfloat16
runs the module on bfloat16 weights and activations (products on the CPU's bf16 instructions where
it has them), float16 on float16 storage computed in float.
The output file is written atomically: on any error no output file is left.)";
}

namespace {

bool is_float(st::DType dtype) {
  return dtype == st::DType::F32 || dtype == st::DType::F64 || dtype == st::DType::F16 || dtype == st::DType::BF16;
}

// A float tensor (query, key, value, grad_output): any float dtype, converted to T.
template <class T>
Tensor<T> read_float(const st::TensorRef& data, const std::string& name) {
  check(is_float(data.dtype), name, ": expected a float dtype (F16, BF16, F32, F64), got ", st::to_string(data.dtype));
  return st::to_tensor<T>(data, name);
}

template <class T>
std::optional<nn::Mask<T>> read_mask(const st::MappedFile& inputs, const std::string& name) {
  auto it = inputs.tensors().find(name);
  if (it == inputs.tensors().end()) return std::nullopt;
  const st::DType dtype = it->second.dtype;
  if (dtype == st::DType::BOOL) return st::to_tensor<bool>(it->second, name);
  check(is_float(dtype), name, ": expected dtype BOOL or a float dtype (F16, BF16, F32, F64), got ",
        st::to_string(dtype));
  return st::to_tensor<T>(it->second, name);
}

template <class T>
void run(const AttentionArgs& args) {
  StageTimer timer;
  nn::MultiheadAttentionOptions options = args.module;
  if (args.kdim) options.kdim = args.kdim;
  if (args.vdim) options.vdim = args.vdim;
  if (!args.window.empty()) {
    options.scoring.window_left = args.window[0];
    options.scoring.window_right = args.window[1];
  }
  nn::MultiheadAttention<T> module(options, args.seed);
  module.train(args.train);
  module.backend = parse_backend(args.backend);

  if (!args.weights_path.empty()) module.load_state_dict(nn::load_state_dict_file<T>(args.weights_path));
  // Under mpirun, the attention split across the ranks; rank 0 writes the results.
  bool writer = true;
#if MHA_WITH_MPI
  if constexpr (is_half_v<T>) {
    check(args.context_parallel.empty(), "--context-parallel: expected --dtype float32 or float64, got --dtype ",
          args.dtype);
  } else if (!args.context_parallel.empty()) {
    auto& comm = distributed::Communicator::world();
    module.core = distributed::context_parallel_core<T>(
        comm, args.context_parallel == "ulysses" ? distributed::Scheme::ulysses : distributed::Scheme::ring,
        args.layout == "zigzag" ? distributed::Layout::zigzag : distributed::Layout::contiguous);
    writer = comm.rank() == 0;
  }
#endif
  timer.stage("weights");

  // Each input is decoded once, from the mapped file straight into its tensor.
  const st::MappedFile inputs(args.inputs_path);
  // A misspelt name would otherwise be ignored (a key_padding_msk would run unmasked), as
  // --weights refuses names it does not know.
  static const char* const accepted[] = {"query",        "key",   "value",        "key_padding_mask",
                                         "attn_mask",    "sinks", "alibi_slopes", "grad_output"};
  for (const auto& entry : inputs.tensors()) {
    check(std::find(std::begin(accepted), std::end(accepted), entry.first) != std::end(accepted), args.inputs_path,
          ": unknown tensor '", entry.first,
          "' (--inputs takes query, key, value, key_padding_mask, attn_mask, sinks, alibi_slopes, grad_output)");
  }
  const Tensor<T> query = read_float<T>(inputs.require("query", args.inputs_path), "query");
  auto optional_input = [&](const char* name) {
    auto it = inputs.tensors().find(name);
    return it == inputs.tensors().end() ? query : read_float<T>(it->second, name);
  };
  const Tensor<T> key = optional_input("key"), value = optional_input("value");

  nn::MultiheadAttentionArgs<T> forward_args;
  forward_args.key_padding_mask = read_mask<T>(inputs, "key_padding_mask");
  forward_args.attn_mask = read_mask<T>(inputs, "attn_mask");
  forward_args.need_weights = args.need_weights;
  forward_args.average_attn_weights = args.average_attn_weights;
  forward_args.is_causal = args.is_causal;
  for (auto [name, into] : {std::pair{"sinks", &forward_args.sinks}, std::pair{"alibi_slopes", &forward_args.alibi_slopes}})
    if (auto it = inputs.tensors().find(name); it != inputs.tensors().end()) *into = read_float<T>(it->second, name);
  timer.stage("read");

  nn::MultiheadAttentionCache<T> cache;
  auto result = module.forward(query, key, value, forward_args, args.backward ? &cache : nullptr);
  timer.stage("forward");

  st::File out;
  out.metadata["producer"] = "mha attention";
  out.tensors["output"] = st::from_tensor(result.output);
  if (result.attn_weights) out.tensors["attn_weights"] = st::from_tensor(*result.attn_weights);
  if (args.backward) {
    const Tensor<T> grad_output =
        read_float<T>(inputs.require("grad_output", args.inputs_path + " (needed by --backward)"), "grad_output");
    module.zero_grad();
    auto grads = module.backward(grad_output, cache);
    out.tensors["grad_query"] = st::from_tensor(grads.grad_query);
    out.tensors["grad_key"] = st::from_tensor(grads.grad_key);
    out.tensors["grad_value"] = st::from_tensor(grads.grad_value);
    if (grads.grad_sinks) out.tensors["grad_sinks"] = st::from_tensor(*grads.grad_sinks);
    for (const auto& p : module.parameters()) out.tensors["grad." + p.name] = st::from_tensor(*p.grad);
    timer.stage("backward");
  }
  if (writer) st::save(out, args.output_path);
  timer.stage("write");
  if (args.timings && writer) std::fputs(timer.report().c_str(), stderr);
}

}  // namespace

void add_attention_command(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention", "Run torch.nn.MultiheadAttention's forward (and backward) on tensors from .safetensors files.");
  cmd->footer(attention_contract());
  cmd->add_option("--weights", args->weights_path, "state_dict .safetensors (PyTorch names)")->check(CLI::ExistingFile);
  cmd->add_option("--inputs", args->inputs_path, "inputs .safetensors (query, key, value, masks, grad_output)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output", args->output_path, "where to write the results (.safetensors)")->required();
  cmd->add_option("--dtype", args->dtype, "computation precision")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16"}))
      ->capture_default_str();
  add_backend_option(cmd, args->backend);
  // Module arguments: PyTorch's names and defaults.
  cmd->add_option("--embed-dim", args->module.embed_dim, "embed_dim: total width of the model")
      ->required()
      ->check(integer_bounds(1));
  cmd->add_option("--num-heads", args->module.num_heads, "num_heads: parallel attention heads")
      ->required()
      ->check(integer_bounds(1));
  cmd->add_option("--dropout", args->module.dropout, "dropout probability on attention weights (training only)")
      ->capture_default_str();
  cmd->add_flag("--bias,!--no-bias", args->module.bias, "bias in the input/output projections (default on)");
  cmd->add_flag("--add-bias-kv,!--no-add-bias-kv", args->module.add_bias_kv, "add learned bias_k/bias_v to key/value");
  cmd->add_flag("--add-zero-attn,!--no-add-zero-attn", args->module.add_zero_attn,
                "add a zero key/value to every sequence");
  cmd->add_option("--kdim", args->kdim, "key feature size (default: embed_dim)")->check(integer_bounds(1));
  cmd->add_option("--vdim", args->vdim, "value feature size (default: embed_dim)")->check(integer_bounds(1));
  cmd->add_flag("--batch-first,!--no-batch-first", args->module.batch_first, "inputs are (N, L, E) instead of (L, N, E)");
  cmd->add_option("--window", args->window,
                  "LEFT,RIGHT: a sliding window (FlashAttention-2's window_size): query i sees keys i - LEFT to "
                  "i + RIGHT on the causal diagonal (S - L without causality), -1 = unbounded on that side; "
                  "Hugging Face's sliding_window W with causality is W-1,0")
      ->expected(2)
      ->delimiter(',');
  // The module's other settings: a flag per field of attention::Scoring's list (visit_fields), so
  // that a new setting reaches the command line, but those each call sets (causality, dropout, its
  // seed), a block's (whole_call) and the window's two sides (--window).
  const std::map<std::string, std::string> help = {
      {"softcap", "C: soft-cap the attention's scores, C*tanh(score/C) (Gemma 2's attn_logit_softcapping; 0 = none)"},
      {"chunk_size", "C: chunked attention (Llama 4's attention_chunk_size): a query sees only the keys of its own "
                     "chunk of C positions, on the causal diagonal (S - L without causality); 0 = none"},
      {"scale", "S: multiply q.k by S instead of 1/sqrt(head_dim)"}};
  attention::Scoring::visit_fields([&](const char* name, auto member) {
    const std::string field = name;
    for (const char* own : {"causal", "dropout_p", "dropout_seed", "whole_call", "window_left", "window_right"})
      if (field == own) return;
    std::string flag = "--" + field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const auto it = help.find(field);
    cmd->add_option(flag, args->module.scoring.*member,
                    it != help.end() ? it->second : "attention::Scoring::" + field + " (docs/variants.md)");
  });
  // Forward arguments.
  cmd->add_flag("--need-weights,!--no-need-weights", args->need_weights, "also return attention weights (default on)");
  cmd->add_flag("--average-attn-weights,!--no-average-attn-weights", args->average_attn_weights,
                "average the weights over heads (default on)");
  cmd->add_flag("--is-causal,!--no-is-causal", args->is_causal, "hint that attn_mask is the causal mask");
  // Mode.
  cmd->add_flag("--train,!--eval", args->train, "training mode (dropout active); default eval");
  cmd->add_option("--seed", args->seed, "seed for initialisation and dropout")
      ->check(unsigned_64())
      ->capture_default_str();
  cmd->add_flag("--backward", args->backward, "also compute gradients for grad_output");
  cmd->add_flag("--timings", args->timings,
                "print the wall-clock time of each stage (weights, read, forward, backward, write) to stderr");
  cmd->add_option("--context-parallel", args->context_parallel,
                  "under mpirun: split the attention's sequence across the ranks, by ring or all-to-all over heads "
                  "(ulysses); rank 0 writes the output (needs --no-need-weights)")
      ->check(CLI::IsMember({"ring", "ulysses"}));
  cmd->add_option("--layout", args->layout, "with --context-parallel: each rank's rows of the sequence")
      ->check(CLI::IsMember({"contiguous", "zigzag"}))
      ->capture_default_str();
  cmd->callback([args, cmd] {
    auto body = [args] {
      if (args->dtype == "float64") {
        run<double>(*args);
      } else if (args->dtype == "bfloat16") {
        run<bfloat16>(*args);
      } else if (args->dtype == "float16") {
        run<float16>(*args);
      } else {
        run<float>(*args);
      }
      return 0;
    };
    if (args->context_parallel.empty()) {
      check(cmd->get_option("--layout")->count() == 0, "--layout: expected only with --context-parallel, got --layout ",
            args->layout, " alone");
      body();
      return;
    }
#if MHA_WITH_MPI
    // An error on any rank ends every rank (none is left waiting for its messages).
    auto& comm = distributed::Communicator::world();
    distributed::run_or_abort(comm, [&] {
      check_ranks_agree(comm, *cmd, {{"--weights", args->weights_path}, {"--inputs", args->inputs_path}});
      return body();
    });
#else
    throw Error("--context-parallel: this mha was built without MPI (install libopenmpi-dev and rebuild)");
#endif
  });
}

}  // namespace mha::tools
