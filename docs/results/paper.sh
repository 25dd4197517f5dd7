#!/usr/bin/env bash
# The combined ablation table (MAE Table 1's form, a sub-table per study) and MAE Figure 5, from
# the committed reports' trials.csv (each with its study.json, or the full grid of the built-in
# study), into docs/results/paper/: table1.tex, fig_mask_ratio*, paper_preview.tex, and, where
# pdflatex and pdftoppm are installed, paper_preview.pdf and table1.png (the page cropped to its
# ink, for the README). No MLflow store is needed: a committed report is enough.
#
#   bash docs/results/paper.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
mae_study="${MAE_STUDY:-$repo/.venv/bin/mae-study}"
sources=()
# MAE Table 1's order: (a) depth, (b) width, (c) mask token, (d) target, (f) mask sampling; then
# the mask ratio, whose study also gives Figure 5. Each row is the study on Fashion-MNIST
# (fashion_NAME, issue 34) where its report is committed, else the digits testbed's.
for name in decoder_depth decoder_width mask_token target mask_sampling mask_ratio; do
  for study in "fashion_$name" "$name"; do
    [ -f "$here/$study/trials.csv" ] && { sources+=("$study=$here/$study/trials.csv"); break; }
  done
done
[ ${#sources[@]} -gt 0 ] || { echo "paper.sh: no trials.csv under $here" >&2; exit 2; }
out="$here/paper"; rm -rf "$out"
"$mae_study" report --paper "${sources[@]}" --report-dir "$out"
if command -v pdflatex >/dev/null && command -v pdftoppm >/dev/null; then
  # the preview page, and a page with the table alone for the README's picture
  (cd "$out" && sed '/fig_mask_ratio.tex/d' paper_preview.tex > table1_page.tex \
     && for doc in paper_preview table1_page; do
          pdflatex -interaction=nonstopmode -halt-on-error "$doc.tex" >/dev/null; rm -f "$doc.aux" "$doc.log"
        done \
     && pdftoppm -png -r 200 -f 1 -l 1 -singlefile table1_page.pdf page && rm -f table1_page.*)
  "$repo/.venv/bin/python" - "$out" <<'PY'
import sys
from pathlib import Path
from PIL import Image, ImageOps
out = Path(sys.argv[1])
page = Image.open(out / "page.png").convert("RGB")
box = ImageOps.invert(page).getbbox()  # the ink: everything not white
page.crop((box[0] - 20, box[1] - 20, box[2] + 20, box[3] + 20)).save(out / "table1.png")
(out / "page.png").unlink()
PY
fi
ls "$out"
