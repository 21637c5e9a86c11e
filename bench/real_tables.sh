#!/usr/bin/env bash
# The results on the real tables (research/tau-study.md) in ../shared/data: every command, seeds 42,7,99.
# Writes JSON and PNG into ${OUT:-out/real}. Takes ~15 min on 2 cores once embeddings are cached
# (the first run encodes ~27k prompts: ~10 min more).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled
OUT=${OUT:-out/real}; mkdir -p "$OUT"
D=../shared/data
run() { name=$1; shift; echo "== $name: proxray eval $*"; .venv/bin/proxray eval "$@" --json "$OUT/$name.json" --plot "$OUT/$name.png"; }

# RouterBench slice: one task as outlier.
for o in mbpp arc-challenge winogrande; do
  run "rb_km_$o" --table $D/routerbench_slice.parquet --router km --protocol leave-task-out --outliers $o
  run "rb_knn_$o" --table $D/routerbench_slice.parquet --router knn --protocol few-shot-outlier --outliers $o
done
# BBH (19 open models, 12 subtasks): 3-4 subtasks as outliers, both protocols, both routers.
for o in boolean_expressions,navigate,object_counting geometric_shapes,ruin_names,movie_recommendation,salient_translation_error_detection; do
  tag=$(echo $o | cut -c1-12)
  for p in leave-task-out few-shot-outlier; do
    run "bbh_km_${p}_$tag" --table $D/bbh19_dev.parquet --router km --protocol $p --outliers $o
    run "bbh_knn_${p}_$tag" --table $D/bbh19_dev.parquet --router knn --protocol $p --outliers $o
  done
done
# RouterDC (7 models, no cost): accuracy-only metrics.
run "dc_km_math" --table $D/routerdc7.parquet --router km --protocol leave-task-out --outliers gsm8k,math_prealgebra
run "dc_knn_math" --table $D/routerdc7.parquet --router knn --protocol few-shot-outlier --outliers gsm8k,math_prealgebra
run "dc_km_code" --table $D/routerdc7.parquet --router km --protocol leave-task-out --outliers humaneval,mbpp,javascript
