"""Pretrain once, evaluate many (studies.pretrained): the key, the lock and the atomic file, and a
reusing trial that equals one that trained."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from conftest import tiny_config
from mlflow.tracking import MlflowClient

from mae_core import build_model
from mae_core.train import prepare_data
from studies.pretrained import PretrainedCache, pretraining_key, read_encoder


def _key(config, data=None):
    return pretraining_key(config, data if data is not None else prepare_data(config))


def test_eval_keys_leave_the_key_and_every_other_key_or_the_seed_changes_it():
    reference = tiny_config()
    key = _key(reference)
    for same in ({"eval.fewshot": 2}, {"eval.knn_ks": "3,7"}, {"eval.finetune_steps": 4, "eval.finetune_blocks": 1},
                 {"eval.linear_head": "bn_linear"}):
        assert _key(tiny_config(**same)) == key, same
    for changed in (dict(seed=1), dict(mask_ratio=0.5), dict(steps=6), dict(decoder_width=16), dict(lr=1e-3),
                    dict(log_every=2), dict(train_limit=32), dict(target="norm_eps")):
        assert _key(tiny_config(**changed)) != key, changed
    data = prepare_data(reference)  # the pretraining images themselves
    fewer = dataclasses.replace(data, train_images=data.train_images.take(slice(0, 63)))
    assert _key(reference, fewer) != key


def _model(config):
    torch.manual_seed(config.seed)
    return build_model(config)


def test_two_trials_asking_at_once_train_a_key_once_and_the_file_is_whole(tmp_path):
    config = tiny_config()
    calls, started = [], threading.Event()
    caches = [PretrainedCache(tmp_path), PretrainedCache(tmp_path)]

    def first():
        with caches[0].claim("k") as claim:
            assert claim.found is None
            calls.append(1)
            started.set()
            time.sleep(0.3)  # the other asks meanwhile
            assert not claim.path.exists()  # nothing is there until the whole file is renamed into place
            claim.keep(_model(config), [(1, 0.5)], "run-a", 1.5)

    thread = threading.Thread(target=first)
    thread.start()
    started.wait()
    with caches[1].claim("k") as claim:
        found = claim.found
    thread.join()
    assert len(calls) == 1 and found is not None
    assert (found.run_id, found.history, found.train_seconds) == ("run-a", [(1, 0.5)], 1.5)
    reference = _model(config).state_dict()
    assert all(torch.equal(found.model[name], tensor) for name, tensor in reference.items())
    assert [c.outcomes for c in caches] == [[("k", "computed")], [("k", "reused")]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.lock", "k.pt"]  # no temporary file left


def test_an_interrupted_training_keeps_nothing_and_a_damaged_file_is_trained_again(tmp_path):
    cache = PretrainedCache(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with cache.claim("k"):
            raise KeyboardInterrupt  # the trial stopped while training: no file, the lock released
    assert not cache.path("k").exists() and cache.outcomes == []
    (tmp_path / "k.pt.123.tmp").write_bytes(b"half a file")  # a crash mid-write leaves only this
    with cache.claim("k") as claim:
        assert claim.found is None
    cache.path("k").write_bytes(b"damaged")
    assert read_encoder(cache.path("k")) is None
    with cache.claim("k") as claim:
        assert claim.found is None  # trained again, and written over the damaged file
        claim.keep(_model(tiny_config()), [], "run-b", 0.0)
    assert read_encoder(cache.path("k")).run_id == "run-b"


def test_a_trial_resuming_its_own_training_computes_and_keeps_the_stored_file(tmp_path):
    cache = PretrainedCache(tmp_path)
    with cache.claim("k") as claim:
        claim.keep(_model(tiny_config()), [], "run-a", 1.0)
    with cache.claim("k", own_work=True) as claim:
        assert claim.found is None
        claim.keep(_model(tiny_config(seed=1)), [], "run-b", 2.0)
    assert read_encoder(cache.path("k")).run_id == "run-a"


def test_a_reusing_trial_logs_what_a_trial_that_trained_logs(tmp_path):
    from studies.trial import run_trial

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    cache = PretrainedCache(tmp_path / "pretrained")
    first = tiny_config(checkpoint_every=2, **{"eval.fewshot": 2})
    second = tiny_config(checkpoint_every=2, **{"eval.fewshot": 4})
    computed = run_trial(first, prepare_data(first), tracking_uri=uri, checkpoint_path=tmp_path / "a" / "c.pt",
                         pretrained=cache)
    reused = run_trial(second, prepare_data(second), tracking_uri=uri, checkpoint_path=tmp_path / "b" / "c.pt",
                       pretrained=cache)

    key = pretraining_key(first, prepare_data(first))
    tags = [client.get_run(o.run_id).data.tags for o in (computed, reused)]
    assert tags[0]["pretraining"] == f"computed {key}" and tags[1]["pretraining"] == f"reused {key}"
    assert tags[1]["pretraining_run"] == computed.run_id and "pretraining_run" not in tags[0]
    assert not (tmp_path / "b").exists()  # no training, so no checkpoint
    history = [[(m.step, m.value) for m in client.get_metric_history(o.run_id, "train_loss")]
               for o in (computed, reused)]
    assert history[0] == history[1] and len(history[0]) == first.steps
    assert reused.train_seconds == computed.train_seconds
    assert client.get_run(reused.run_id).data.params["eval.fewshot"] == "4"
    # every metric but the few-shot probe's (the one setting that differs) and the clock's
    kept = {k for k in computed.metrics if not k.startswith(("probe_fewshot", "random_probe_fewshot",
                                                              "pixel_probe_fewshot", "eval_seconds"))}
    assert {k: reused.metrics[k] for k in kept} == {k: computed.metrics[k] for k in kept}
    assert "probe_linear_acc" in kept and "test_mae_risk" in kept
