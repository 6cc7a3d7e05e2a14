#!/usr/bin/env bash
# On a lent GPU machine (16 cores, one GPU, torch, torchvision, JAX and Pillow, no network),
# from the repository's root, with target/device carried (`make device-pack` here):
#   bash benches/device_check.sh
# One venv over the machine's packages gets the carried wheel and test tools; then the GPU
# tests, the 16-core side by side (issue 31: the native chain against PyTorch + Pillow and
# torchvision v2 at 16 workers, folders and tar shards, threads busy) and the GPU feed at
# 16 threads (`device="cuda"` against the CPU output). Logs and results go to $OUT (the
# device tool's folder that comes back; /tmp/ff-out elsewhere). Each step has a time limit
# so that the whole run fits one 10-minute call; a failing step does not stop the next.
set -uo pipefail
DEVICE_DIR=${DEVICE_DIR:-target/device}
OUT=${OUT:-/tmp/ff-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FERROFEED_BENCH_PHOTOS="$(cd "$DEVICE_DIR/photos" && pwd)"
# Made once per machine (a second call on a warm machine reuses it).
VENV=${VENV:-/tmp/ff-device-venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install -q --no-index --no-deps "$DEVICE_DIR"/wheels/*.whl
fi
PY="$VENV/bin/python"
{ nproc; nvidia-smi -L; "$PY" -c 'import ferrofeed, torch; print(ferrofeed.build_info(), torch.__version__)'; } 2>&1 | tee "$OUT/machine.log"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/test_gpu.log"
timeout 300 "$PY" benches/scaling.py --compare --threads 16 --batch-sizes 32 --proxy-threads '' \
    --out "$OUT" --name scaling_16 2>&1 | tee "$OUT/scaling_16.log"
timeout 120 "$PY" benches/gpu_feed.py --threads 16 --rounds 1 --out-dir "$OUT" 2>&1 | tee "$OUT/gpu_feed.log"
