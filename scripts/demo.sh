#!/usr/bin/env bash
# `make demo`: a short tour of mha through three of the tutorial scenarios, a real pretrained sentence
# encoder (all-MiniLM-L6-v2) ranking sentences, generation with a KV cache, mha from Python, the
# attention variants models use (window, soft-cap, sinks, ALiBi, packed sequences), all-MiniLM-L6-v2 inside
# Hugging Face transformers (attn_implementation="mha" beside "sdpa"), serving (paged and int8
# caches, a mixed batch in one call, generate() on paged pages, continuous batching), then one attention call
# split across four processes (MPI, when built with it). Each example prints
# the shape of every stage and checks itself against the plain formula (exit 1 on a mismatch);
# the attention pictures go to build/demo/.
set -euo pipefail
build=${1:-build}
pictures="$build/demo"
mkdir -p "$pictures"

section() { printf '\n\033[1m== %s ==\033[0m\n\n' "$1"; }

section "1/10  Sentence self-attention (tutorial 000): tokens, padding, 512-wide embedding, 8 heads"
"$build/examples/sentence_self_attention" --heatmap "$pictures/sentence_self_attention.png"

section "2/10  Cross-attention with q/k head size 16 != v head size 32 (tutorial 003)"
"$build/examples/cross_attention" --heatmap "$pictures/cross_attention.png"

section "3/10  Pre-norm residual block, forward and backward (tutorial 001)"
"$build/examples/pre_norm_residual_block"

section "4/10  Semantic search with all-MiniLM-L6-v2 (a pretrained BERT encoder, tokenizer to embeddings, in mha)"
"$build/examples/semantic_search"
echo "-- the same in bfloat16 (the encoder's layers on the CPU's bf16 instructions where it has them):"
"$build/examples/semantic_search" --dtype bfloat16 --top 1

section "5/10  Generation with a KV cache: token by token, checked against the full recompute (bfloat16 cache)"
"$build/examples/generate" --cache bfloat16

section "6/10  From Python: the numpy API, and mha inside PyTorch (examples/python)"
"${PYTHON:-.venv/bin/python}" examples/python/attention_from_python.py

section "7/10  The variants models use: sliding window, soft-cap, sinks, ALiBi, packed sequences (examples/python/variants.py)"
"${PYTHON:-.venv/bin/python}" examples/python/variants.py

section "8/10  Inside Hugging Face transformers: all-MiniLM-L6-v2 with attn_implementation=\"mha\" beside \"sdpa\" (examples/python/transformers_minilm.py)"
"${PYTHON:-.venv/bin/python}" examples/python/transformers_minilm.py

section "9/10  Serving: a paged int8 cache, a prefill chunk and decode rows in one call, generate() on paged pages, continuous batching (examples/python/serving.py)"
"${PYTHON:-.venv/bin/python}" examples/python/serving.py

section "10/10  Across processes: one causal attention call split over 4 MPI ranks (ring and Ulysses), checked"
if [[ -x "$build/examples/context_parallel" ]]; then
  # Open MPI as root in a container, more ranks than cores, idle ranks yielding (docs/distributed.md).
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 \
    mpiexec -n 4 "$build/examples/context_parallel"
else
  echo "(built without MPI: apt-get install libopenmpi-dev openmpi-bin, then rebuild)"
fi

section "Pictures"
echo "Attention weights, one panel per head:"
for png in "$pictures"/*.png; do echo "  $(realpath "$png")"; done
echo
echo "More: build/examples/attention_classifier, build/examples/attention_levels; docs/ explains each scenario."
