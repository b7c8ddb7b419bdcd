#!/usr/bin/env bash
# On the GPU machine: produce the model goldens from transformers (float64) as $OUT/goldens.tar.gz.
# Expects the tiny checkpoints under goldens-input/seed{1,2,3} (carried from the dev box,
# written there by `lily make-checkpoint --profile tiny --seed S`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
work=$(mktemp -d)
args=()
for seed in 1 2 3; do args+=(--checkpoint "goldens-input/seed$seed" --seed "$seed"); done
export PYTHONUNBUFFERED=1
python3 tools/goldens/make_goldens.py "${args[@]}" --out "$work/model" 2>&1 | tee "$out/goldens.log"
tar -czf "$out/goldens.tar.gz" -C "$work" model
