#!/usr/bin/env bash
# Measure a few validation rows with the CUDA allocator on a GPU machine; write JSON to $OUT.
#
# Installs nothing: uses the machine's python3 with torch and transformers (5.x) already there.
# Run from the repository root:  OUT=/some/dir bash tools/gpu_measure.sh
# Writes $OUT/gpu_matrix.json (per row: estimated vs measured per component, allocator stats),
# $OUT/gpu_pytest.txt (the gpu-marked test) and $OUT/env.txt.
set -euo pipefail
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "$PY" -c 'import torch, transformers, sympy; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "sympy", sympy.__version__)'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# the rows (about a minute each on an H100/H200; LLaMA-7B with AdamW needs ~55 GB + activations)
timeout "${ROWS_TIMEOUT:-420}" "$PY" -m vrammath.measure.matrix --cuda --out "$OUT/gpu_matrix.json" \
  2>&1 | tee "$OUT/gpu_rows.txt" || echo "rows: exit $?" | tee -a "$OUT/gpu_rows.txt"
# the gpu-marked test (skips without CUDA)
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/measure -o addopts="" \
  2>&1 | tee "$OUT/gpu_pytest.txt" || true
