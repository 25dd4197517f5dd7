"""The lesson's third exercise as a paired test: the larger decoder (64 wide x 3 blocks,
``lesson_large_decoder/``) against the lesson's own (16 x 1, ``lesson/``), cell by cell.

The two reports are two runs of the lesson study that differ only in the decoder, with the
same seeds and data splits, so each mask ratio's trials pair by seed (the initial weights
differ: a bigger decoder takes more draws from the seed's generator). Holm-corrected over the
four ratios of each metric; the claim is "the larger decoder is better" (lower risk, higher
accuracy). Writes ``lesson_large_decoder/against_lesson.csv`` and
prints it as a Markdown table.

    .venv/bin/python docs/results/lesson_decoders.py
"""

from pathlib import Path

import pandas as pd

from analysis.stats import holm, paired_difference, verdict

HERE = Path(__file__).resolve().parent
METRICS = ["test_mae_risk", "probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc", "finetune_acc"]


def main() -> None:
    small = pd.read_csv(HERE / "lesson" / "trials.csv")
    large = pd.read_csv(HERE / "lesson_large_decoder" / "trials.csv")
    rows = []
    for ratio in sorted(small["mask_ratio"].unique()):
        mine = large[large["mask_ratio"] == ratio].set_index("seed")
        theirs = small[small["mask_ratio"] == ratio].set_index("seed")
        seeds = mine.index.intersection(theirs.index)
        for metric in METRICS:
            rows.append({"mask_ratio": ratio, "metric": metric,
                         **paired_difference(mine.loc[seeds, metric].to_numpy(), theirs.loc[seeds, metric].to_numpy())})
    table = pd.DataFrame(rows)
    table["p_holm"] = table.groupby("metric")["p"].transform(lambda p: holm(p.to_numpy()))
    table["verdict"] = [verdict(row) for _, row in table.iterrows()]
    table.to_csv(HERE / "lesson_large_decoder" / "against_lesson.csv", index=False)
    print("| ρ | metric | 16×1 | 64×3 | difference | 95% CI | Holm p | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for _, r in table.iterrows():
        print(f"| {r.mask_ratio:g} | {r.metric} | {r.reference_mean:.4g} | {r['mean']:.4g} | {r.mean_diff:+.4f} "
              f"| [{r.ci_low:+.4f}, {r.ci_high:+.4f}] | {r.p_holm:.2g} | {r.verdict} |")


if __name__ == "__main__":
    main()
