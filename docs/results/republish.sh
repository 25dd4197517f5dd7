#!/usr/bin/env bash
# Re-run built-in studies and rewrite their reports under docs/results/ (the command behind every
# number there). Each study gets its own folder under ROOT: its MLflow store (mlflow.db and
# artifacts) and Ray state, kept so the reports can be regenerated from the store alone.
#
#   bash docs/results/republish.sh ROOT [STUDY ...]      # default: every study, in this order
#
# Wall times go to ROOT/times.tsv (study, seconds for the run, seconds for the report).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
root="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
mae_study="${MAE_STUDY:-$repo/.venv/bin/mae-study}"
studies=("$@")
[ ${#studies[@]} -gt 0 ] || studies=(mask_ratio mask_token target decoder_depth objectives mask_sampling
                                     decoder_width schedule corruption lesson lesson_large_decoder partial_finetune
                                     fashion_mask_ratio fashion_decoder_depth fashion_decoder_width
                                     fashion_mask_token fashion_target fashion_mask_sampling fashion_objectives)
for name in "${studies[@]}"; do
  study="$name"; extra=()
  # the lesson's third exercise: a decoder larger than the encoder (seed 001)
  [ "$name" = lesson_large_decoder ] && { study=lesson; extra=(decoder_width=64 decoder_depth=3); }
  dir="$root/$name"; mkdir -p "$dir"   # --out: mlflow.db, mlartifacts/ and $study/ (Ray's state)
  start=$(date +%s)
  (cd "$dir" && "$mae_study" run "$study" "${extra[@]}" --out "$dir")
  mid=$(date +%s)
  rm -rf "${here:?}/$name"
  (cd "$dir" && "$mae_study" report "$study" --out "$dir" --report-dir "$here/$name")
  end=$(date +%s)
  printf '%s\t%s\t%s\n' "$name" $((mid - start)) $((end - mid)) >> "$root/times.tsv"
done
