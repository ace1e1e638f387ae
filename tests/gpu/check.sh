#!/bin/sh
# rigup on a real NVIDIA machine with no network (e.g. the lent H200): build llama.cpp with the
# llama_cpp role's own script for the plan's archs, make a random-weight 8B-shaped GGUF, run the
# role's smoke inference (roles/llama_cpp/shipped/smoke.py on the GPU and on the CPU alone, with and
# without weight repacking: check.py smoke), then measure llama-bench and llama-server with
# roles/llama_server's flags against hand-started llama-server. It only READS GPU settings (and
# prints them before and after).
#   sh tests/gpu/check.sh [OUT_DIR]     from the repository root; needs .gpu/llama.cpp.tar.gz:
#   a llama.cpp tree (e.g. `git -C /var/lib/rigup-lab/srv/llama.cpp.git archive --prefix=llama.cpp/ lab-base | gzip`)
set -eu
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
out=${1:-${OUT:-/tmp/rigup-gpu-out}}
work=${RIGUP_GPU_WORK:-/root/rigup-gpu}
python3 tests/gpu/check.py build --work "$work"
python3 tests/gpu/check.py model --work "$work"
python3 tests/gpu/check.py smoke --work "$work" --out "$out"
python3 tests/gpu/check.py serve --work "$work" --out "$out"
sh tests/gpu/power_plan.sh
