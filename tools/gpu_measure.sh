#!/usr/bin/env bash
# On a machine with a CUDA GPU: measure the validation matrix's GPU rows with the CUDA caching
# allocator and compare them with vrammath's allocator prediction for the same steps.
#
# Installs nothing: uses the machine's python3 with torch and transformers (5.x) already there.
# Run from the repository root:  bash tools/gpu_measure.sh   (about 6-7 minutes on an H100/H200)
# Writes validation/matrix-cuda.json: per GPU row, the real max_memory_allocated /
# max_memory_reserved and the context left outside the allocator, the predicted ones
# (vrammath.terms.allocator.predict over the row's CPU event log), the matrix's per-component
# comparison, and the relative errors. Rows are started cheapest first while under 300 s have
# passed; the file is rewritten after every row, so a cut run still leaves the finished rows.
# With OUT set, also copies it and the environment / log files to $OUT.
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
LOG="${OUT:-validation}"
mkdir -p validation "$LOG"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "$PY" -c 'import torch, transformers, sympy; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "sympy", sympy.__version__)'
} > "$LOG/gpu_env.txt" 2>&1
cat "$LOG/gpu_env.txt"
# 300 s of row starts + the longest row (LLaMA-7B at s=4096, about a minute) stays under 8 min
timeout "${ROWS_TIMEOUT:-440}" "$PY" -m vrammath.measure.allocator_events --cuda \
  --budget-s "${BUDGET_S:-300}" --out validation/matrix-cuda.json \
  2>&1 | grep -v Warning | tee "$LOG/gpu_rows.txt" || echo "rows: exit $?" | tee -a "$LOG/gpu_rows.txt"
if [ -n "${OUT:-}" ] && [ -f validation/matrix-cuda.json ]; then
  cp validation/matrix-cuda.json "$OUT/"
fi
