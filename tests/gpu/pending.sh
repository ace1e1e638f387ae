#!/bin/sh
# What the open issues still ask of a real GPU, in one device run (about 15 minutes on the lent
# H200; python3, nvidia-smi and the driver only; reads GPU settings, never changes them):
# - issue 48: the driver and fabric plan of this machine (tests/gpu/driver_plan.py);
# - issue 50: rigup-burnin's quick and standard levels (tests/gpu/burnin.sh);
# - issue 49: the router's swap seconds (page cache, cold read) and its throughput after a swap
#   against a dedicated server (check.py router; builds llama.cpp and the 8B-shaped model first
#   when /root/rigup-gpu has none).
#   sh tests/gpu/pending.sh [OUT]      from the repository root; needs .gpu/llama.cpp.tar.gz
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
out=${1:-${OUT:-/tmp/rigup-gpu-out}}
work=${RIGUP_GPU_WORK:-/root/rigup-gpu}
mkdir -p "$out"
q="nvidia-smi --query-gpu=index,uuid,power.limit,persistence_mode,ecc.mode.current,compute_mode,clocks.applications.graphics --format=csv,noheader"
before=$($q)
rc=0
python3 tests/gpu/driver_plan.py --json "$out/driver-plan.json" > "$out/driver-plan.txt" 2>&1 || rc=1
sh tests/gpu/burnin.sh "$out/burnin" || rc=1
[ -f "$work/build.json" ] || python3 tests/gpu/check.py build --work "$work" || rc=1
[ -f "$work/llama-8b-shape-f16.gguf" ] || python3 tests/gpu/check.py model --work "$work" || rc=1
python3 tests/gpu/check.py router --work "$work" --out "$out" || rc=1
after=$($q)
[ "$before" = "$after" ] && echo "OK: GPU settings unchanged" || { echo "FAIL: GPU settings changed"; rc=1; }
exit $rc
