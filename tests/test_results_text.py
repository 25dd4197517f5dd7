"""The results sections of README.md and docs/results/README.md are what the script writes
from the committed reports: no number there is typed by hand."""

from __future__ import annotations

import pytest

from analysis import results_text


def test_the_results_sections_are_the_scripts_output():
    for path, text in results_text.targets().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path}: its results section is stale; run .venv/bin/python -m analysis.results_text")


def test_every_committed_report_has_its_claims():
    reports = {p.parent.name for p in results_text.RESULTS.glob("*/trials.csv")}
    assert reports and reports == {p.name for p in results_text.report_folders()}


def test_a_file_without_the_markers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no <!-- results:begin -->"):
        results_text.splice("# no markers\n", "table", tmp_path / "README.md")


def test_counts_are_per_study_with_variants_shown_once_and_capped_claims_said(tmp_path):
    import pandas as pd

    def report(name: str, study: str, verdicts: list[str], needed: list[float]):
        folder = tmp_path / name
        folder.mkdir()
        pd.DataFrame({"study": study, "claim": [f"c{i}" for i in range(len(verdicts))], "verdict": verdicts,
                      "n_needed": needed, "declared": "after"}).to_csv(folder / "claims.csv", index=False)
        return folder

    own = report("mask_ratio", "mask_ratio", ["better", "inconclusive", "inconclusive", "inconclusive"],
                 [5, 40, 1000, 60])
    variant = report("mask_ratio_until_decided", "mask_ratio", ["better", "better", "inconclusive", "worse"],
                     [10, 10, 90, 10])
    counted, variants = results_text.counted_folders([own, variant])
    assert counted == [own] and variants == {"mask_ratio_until_decided": "mask_ratio"}
    text = results_text.main_readme([own, variant])
    assert text.startswith("4 hypotheses in 1 studies: 1 better, 3 inconclusive (1 of them capped: n needed ≥ 1000);")
    # a variant is one entry of a line below the table, not a row (the README stays short)
    assert ("not counted): [mask_ratio_until_decided](docs/results/mask_ratio_until_decided/) (of mask_ratio: "
            "2 better, 1 worse, 1 inconclusive)." in text)
    assert "| [mask_ratio_until_decided]" not in text
    assert "| 50 (1 capped, left out) |" in text  # the median of 40 and 60; 1000 is no count of seeds


def test_the_readme_lists_real_images_and_sums_the_digits_testbed_in_a_line(tmp_path):
    import pandas as pd

    def report(name: str, dataset: str, verdicts: list[str]):
        folder = tmp_path / name
        folder.mkdir()
        pd.DataFrame({"study": name, "claim": [f"c{i}" for i in range(len(verdicts))], "verdict": verdicts,
                      "n_needed": 5.0, "declared": "before"}).to_csv(folder / "claims.csv", index=False)
        pd.DataFrame({"dataset": [dataset, dataset], "seed": [0, 1]}).to_csv(folder / "trials.csv", index=False)
        return folder

    fashion = report("fashion_target", "fashion_mnist", ["better", "inconclusive"])
    digits, photos = report("mask_ratio", "digits", ["worse"]), report("target", "photos", ["better"])
    assert [results_text.testbed_of(f) for f in (fashion, digits, photos)] == [
        "Fashion-MNIST", results_text.SMALL_TESTBED, results_text.SMALL_TESTBED]
    text = results_text.main_readme([fashion, digits, photos])
    assert text.startswith("On Fashion-MNIST, 2 hypotheses in 1 studies: 1 better, 1 inconclusive; declared: 2 before."
                           " On the digits testbed, 2 hypotheses in 2 studies: 1 better, 1 worse;")
    assert "[fashion_target]" in text and "[mask_ratio]" not in text  # the small testbed: one line
    assert "The 2 reports of the digits testbed (mask_ratio, target)" in text
