"""Partial fine-tuning's share of full fine-tuning's gain, measured from the frozen linear probe.

MAE Figure 9 reads partial fine-tuning against the frozen encoder's linear probe (its zero-block
point). Measured instead from a head trained alone for the fine-tuning length (which can score
below the linear probe: 0.829 against 0.906 in partial_finetune), the share reads too large. For
``n`` tuned blocks: share = mean(partial_n − linear) / mean(full − linear) over the seeds, each
seed's three numbers from one pretrained encoder, with a percentile bootstrap over seeds
(``scipy.stats.bootstrap``, paired).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as sps

AXIS = "eval.finetune_blocks"
NEEDED = ("partial_finetune_acc", "finetune_acc", "probe_linear_acc")


def _share(partial, full, linear, axis=-1):
    return np.mean(partial - linear, axis=axis) / np.mean(full - linear, axis=axis)


def shares(frame: pd.DataFrame) -> pd.DataFrame:
    """A row per tuned-block count other than ``all``: ``blocks``, ``n`` seeds, ``share`` and its
    95% bootstrap interval (``low``, ``high``). Empty unless the frame varies ``eval.finetune_blocks``
    and logged the three accuracies."""
    finished = frame[frame["status"] == "FINISHED"] if "status" in frame else frame
    if AXIS not in finished or any(m not in finished for m in NEEDED):
        return pd.DataFrame(columns=["blocks", "n", "share", "low", "high"])
    rows = []
    for blocks, cell in finished.groupby(AXIS, sort=False):
        if str(blocks) == "all":
            continue
        data = cell.groupby("seed")[list(NEEDED)].mean().dropna()
        partial, full, linear = (data[m].to_numpy(float) for m in NEEDED)
        share = float(_share(partial, full, linear)) if len(data) else math.nan
        low = high = math.nan
        if len(data) >= 3:
            interval = sps.bootstrap((partial, full, linear), _share, paired=True, vectorized=True,
                                     n_resamples=9999, method="percentile", random_state=0).confidence_interval
            low, high = float(interval.low), float(interval.high)
        rows.append({"blocks": blocks, "n": len(data), "share": share, "low": low, "high": high})
    return pd.DataFrame(rows)


def share_sentences(frame: pd.DataFrame) -> list[str]:
    """The shares in words, one sentence per tuned-block count (none when not applicable)."""
    return [f"{'Training the head alone' if str(r.blocks) == '0' else f'Tuning the last {r.blocks} block(s)'} "
            f"recovers {r.share:.0%} [{r.low:.0%}, {r.high:.0%}] of full fine-tuning's gain over the frozen "
            f"linear probe (n={r.n} seeds; 95% percentile bootstrap over seeds)."
            for r in shares(frame).itertuples() if math.isfinite(r.share)]
