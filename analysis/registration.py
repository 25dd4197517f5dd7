"""Claims registered before a study ran, and the label a report gives each claim it decides.

When a study starts (not on ``--resume`` or a further batch of seeds) its parent run records two
tags (:func:`studies.registration.registration_tags`):

* ``claims_sha256``: the SHA-256 of the claims block as the study file spells it, in canonical
  JSON (:func:`canonical_claims`: keys sorted, no spaces), beside the ``claims`` tag that holds
  the block itself;
* ``study_file_commit``: the git commit (HEAD) at which the study file was committed exactly as
  it was read, or ``uncommitted`` (edited since, never added, or no git checkout).

The report decides every claim as before and labels each one in ``claims.csv``'s ``declared``
column (and on the page, in ``claims.md`` and beside the forest plot):

* ``before``: the claim is in the block hashed at the start (its canonical JSON is one of the
  block's, and the block the report reads still hashes to ``claims_sha256``), and the study file
  was committed then: anyone can check it with ``git show COMMIT:PATH``;
* ``after``: anything else a committed study decides: a claim added or changed after the start,
  or a run that predates these tags (nothing recorded when it started): exploratory;
* ``unregistered``: the study file was not committed when the study started, so nothing shows
  when its claims were written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

CLAIMS_HASH_TAG = "claims_sha256"
COMMIT_TAG = "study_file_commit"
UNCOMMITTED = "uncommitted"
DECLARED = ("before", "after", "unregistered")
# what each label means, in the words the report's paragraph and docs/studies.md use
MEANINGS = {
    "before": "in the claims block hashed when the study started, from a study file committed then",
    "after": "written or changed after the study started, or the run predates registration: exploratory",
    "unregistered": "the study file was not committed when the study started",
}


def _plain(value: Any) -> Any:
    """A claim (or block) as its JSON round trip: what the parent's ``claims`` tag gives back."""
    return json.loads(json.dumps(value, default=str))


def canonical_claims(claims: Sequence[Mapping[str, Any]]) -> str:
    """The block as canonical JSON: the claims in their order, each one's keys sorted, no spaces."""
    return json.dumps(_plain(list(claims)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def claims_sha256(claims: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 (hex) of :func:`canonical_claims` in UTF-8."""
    return hashlib.sha256(canonical_claims(claims).encode("utf-8")).hexdigest()


def _claim_key(claim: Mapping[str, Any]) -> str:
    return json.dumps(_plain(dict(claim)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def registered_claims(info: Mapping[str, Any]) -> set[str] | None:
    """The canonical claims of the block hashed at the start (empty when the study file was not
    committed), or None when the run recorded nothing at its start. ``info``: a report's header
    (:func:`analysis.trials_frame.load_study_info`) with the parent's ``claims`` and both tags."""
    hashed, commit = info.get(CLAIMS_HASH_TAG), info.get(COMMIT_TAG)
    if not hashed or not commit:
        return None
    if commit == UNCOMMITTED:
        return set()
    block = list(info.get("claims") or [])
    if claims_sha256(block) != hashed:  # the block read now is not the one hashed: nothing to vouch for
        return set()
    return {_claim_key(claim) for claim in block}


def declared_labels(claims: Sequence[Mapping[str, Any]], info: Mapping[str, Any]) -> dict[str, str]:
    """Each claim's name -> ``before``, ``after`` or ``unregistered`` (see the module)."""
    if info.get(COMMIT_TAG) == UNCOMMITTED and info.get(CLAIMS_HASH_TAG):
        return {claim.get("name"): "unregistered" for claim in claims}
    registered = registered_claims(info) or set()
    return {claim.get("name"): "before" if _claim_key(claim) in registered else "after" for claim in claims}
