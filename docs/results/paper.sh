#!/usr/bin/env bash
# The combined ablation table (MAE Table 1's form, a sub-table per study) from the stores that
# republish.sh leaves under ROOT, into docs/results/paper/: table1.tex, paper_preview.tex, and,
# where pdflatex and pdftoppm are installed, paper_preview.pdf and table1.png (the page cropped
# to its ink, for the README).
#
#   bash docs/results/paper.sh ROOT
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
root="$(cd "$1" && pwd)"
mae_study="${MAE_STUDY:-$repo/.venv/bin/mae-study}"
sources=()
# MAE Table 1's order: (a) depth, (b) width, (c) mask token, (d) target, (f) mask sampling
for name in decoder_depth decoder_width mask_token target mask_sampling; do
  [ -f "$root/$name/mlflow.db" ] && sources+=("$name=$root/$name")
done
[ ${#sources[@]} -gt 0 ] || { echo "paper.sh: no study store under $root" >&2; exit 2; }
out="$here/paper"; rm -rf "$out"
"$mae_study" report --paper "${sources[@]}" --report-dir "$out"
if command -v pdflatex >/dev/null && command -v pdftoppm >/dev/null; then
  (cd "$out" && pdflatex -interaction=nonstopmode -halt-on-error paper_preview.tex >/dev/null \
     && rm -f paper_preview.aux paper_preview.log && pdftoppm -png -r 200 -f 1 -l 1 -singlefile paper_preview.pdf page)
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
