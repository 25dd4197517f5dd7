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
from mae_core.data import prepare_data
from mae_core.train import train
from studies.pretrained import (PretrainedCache, prefix_lengths, pretraining_key, read_encoder, read_from_longer,
                                reserved_prefixes)


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


def test_a_shorter_length_is_a_prefix_only_where_every_learning_rate_and_record_agree():
    constant = dict(steps=40, log_every=10, schedule="constant", warmup_fraction=0.0)
    lengths = (5, 10, 15, 20, 40, 80)
    assert prefix_lengths(tiny_config(**constant), lengths) == [10, 20]  # logged at S; not itself, not longer
    assert prefix_lengths(tiny_config(**{**constant, "eval.every": 20}), lengths) == [20]  # online points too
    assert prefix_lengths(tiny_config(**{**constant, "warmup_fraction": 0.1}), lengths) == []  # warm-up of 4 vs 1
    assert prefix_lengths(tiny_config(**{**constant, "schedule": "cosine"}), lengths) == []  # decays to its own end
    # a warm-up of so many updates is the same in every length: the lengths it has passed are shared
    counted = tiny_config(**{**constant, "warmup_fraction": 0.1, "warmup_steps": 12})
    assert counted.warmup_updates == 12 and counted.resolved()["warmup_steps"] == 12
    assert prefix_lengths(counted, lengths) == [20]  # a run of 10 would end inside the warm-up: refused


@pytest.mark.parametrize("overrides", [dict(), dict(objective="dae"), dict(optimizer="sgd", lr=0.05)])
def test_a_run_of_s_updates_is_the_first_s_updates_of_a_longer_run(overrides):
    keys = dict(log_every=5, schedule="constant", warmup_fraction=0.0, **overrides)
    short, long = tiny_config(steps=10, **keys), tiny_config(steps=20, **keys)
    data = prepare_data(short)
    kept = {}
    train(long, data, snapshot_steps=(10,),
          on_snapshot=lambda step, model, history: kept.update(
              step=step, history=history, model={k: v.clone() for k, v in model.state_dict().items()}))
    alone = train(short, data)
    assert kept["step"] == 10 and kept["history"] == alone.history
    for name, tensor in alone.model.state_dict().items():
        assert torch.equal(kept["model"][name], tensor), name


def test_a_shorter_trial_evaluates_the_longer_trials_model_as_if_it_had_trained(tmp_path):
    from studies.trial import run_trial

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    keys = dict(log_every=5, checkpoint_every=5, schedule="constant", warmup_fraction=0.0)
    long, short = tiny_config(steps=20, **keys), tiny_config(steps=10, **keys)
    data = prepare_data(short)
    cache = PretrainedCache(tmp_path / "pretrained", lengths=(10, 20))
    longer = run_trial(long, data, tracking_uri=uri, checkpoint_path=tmp_path / "a" / "c.pt", pretrained=cache)
    reused = run_trial(short, data, tracking_uri=uri, checkpoint_path=tmp_path / "b" / "c.pt", pretrained=cache)
    alone = run_trial(short, data, tracking_uri=uri)

    tags = client.get_run(reused.run_id).data.tags
    assert tags["pretraining"] == f"reused {pretraining_key(short, data)}"
    assert tags["pretraining_run"] == longer.run_id and tags["pretraining_source_steps"] == "20"
    assert not (tmp_path / "b").exists()  # it did not train
    histories = [[(m.step, m.value) for m in client.get_metric_history(o.run_id, "train_loss")]
                 for o in (reused, alone)]
    assert histories[0] == histories[1] == [(5, histories[1][0][1]), (10, histories[1][1][1])]
    clocks = ("eval_seconds", "pretrain_seconds", "train_seconds", "updates_per_second")
    assert {k: v for k, v in reused.metrics.items() if k not in clocks} == \
        {k: v for k, v in alone.metrics.items() if k not in clocks}


def test_a_length_another_trial_holds_is_left_to_it(tmp_path):
    keys = dict(log_every=5, schedule="constant", warmup_fraction=0.0)
    long, short = tiny_config(steps=20, **keys), tiny_config(steps=10, **keys)
    data = prepare_data(short)
    cache = PretrainedCache(tmp_path, lengths=(10, 20))
    with PretrainedCache(tmp_path).claim(pretraining_key(short, data)) as claim:  # the short trial trains itself
        with reserved_prefixes(cache, long, data) as reserved:
            assert reserved == {}
        claim.keep(_model(short), [(5, 1.0), (10, 0.5)], "run-short", 1.0)
    with reserved_prefixes(cache, long, data) as reserved:  # stored already: nothing to keep
        assert reserved == {}
    (tmp_path / f"{pretraining_key(short, data)}.pt").unlink()
    with reserved_prefixes(cache, long, data) as reserved:
        assert list(reserved) == [10]
        assert cache.reserve(pretraining_key(short, data), 10) is None  # held while the longer run trains
    assert cache.reserve(pretraining_key(short, data), 10) is not None  # released on the way out


def test_a_shorter_trial_waits_briefly_for_a_longer_one_to_reserve_its_key(tmp_path):
    cache = PretrainedCache(tmp_path)
    started = time.monotonic()
    cache.await_reservation("free", timeout=0.6)  # nobody comes: it claims after the grace
    assert time.monotonic() - started >= 0.6
    with cache.claim("held"):  # a longer trial holds it: no wait, the claim will queue behind it
        started = time.monotonic()
        PretrainedCache(tmp_path).await_reservation("held", timeout=30)
        assert time.monotonic() - started < 5
    keys = dict(log_every=5, schedule="constant", warmup_fraction=0.0)
    assert read_from_longer(tiny_config(steps=10, **keys), (10, 20))
    assert not read_from_longer(tiny_config(steps=20, **keys), (10, 20))  # the longest
    assert not read_from_longer(tiny_config(steps=10, **{**keys, "schedule": "cosine"}), (10, 20))


def test_a_resumed_longer_trial_reserves_only_the_lengths_it_has_still_to_pass(tmp_path):
    # #25: a longer run resumed at update 10 cannot keep the 10-update model; holding that key
    # would make its trial wait until the longer run ends, then train anyway.
    from studies.trial import _checkpoint_step

    keys = dict(log_every=5, checkpoint_every=5, schedule="constant", warmup_fraction=0.0)
    long = tiny_config(steps=20, **keys)
    data = prepare_data(long)
    cache = PretrainedCache(tmp_path / "pretrained", lengths=(5, 10, 20))
    with reserved_prefixes(cache, long, data, resumes_at=5) as reserved:
        assert list(reserved) == [10]
    with reserved_prefixes(cache, long, data, resumes_at=10) as reserved:
        assert reserved == {}
        assert cache.reserve(pretraining_key(tiny_config(steps=10, **keys), data), 10) is not None
    assert _checkpoint_step(tmp_path / "none.pt") == 0
    train(tiny_config(steps=10, **keys), data, checkpoint_path=tmp_path / "c.pt")
    assert _checkpoint_step(tmp_path / "c.pt") == 10
