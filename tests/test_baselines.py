"""Baselines shared by a study's cells (evaluation.baselines): a read set equals a computed one,
and only cells whose baselines would be equal share a key."""

import dataclasses
import json

import torch

from evaluation.baselines import BaselineCache, baseline_key, is_baseline_metric
from evaluation.probes import probe_metrics, random_init_model
from mae_core.data import prepare_data
from mae_core.train import train

from conftest import tiny_config

FINETUNE = dict(finetune_steps=6, scratch_max_steps=8, scratch_eval_every=4)


def _key(config, data=None):
    data = data if data is not None else prepare_data(config)
    return baseline_key(random_init_model(config), config, data, config.eval, config.seed, torch.device("cpu"))


def test_cells_share_a_key_only_when_their_baselines_read_the_same_things():
    reference = tiny_config()
    key = _key(reference)
    assert _key(tiny_config(mask_ratio=0.5)) == key  # pretraining keys do not enter
    assert _key(tiny_config(target="norm_eps", steps=9)) == key
    # nor how the pretrained encoder is fine-tuned (partial_finetune's rows)
    tuned = {"eval.finetune_steps": 4}
    assert (_key(tiny_config(**tuned, **{"eval.finetune_blocks": 1, "eval.finetune_layer_decay": 0.75}))
            == _key(tiny_config(**tuned)))
    # nor the decoder: one random-init encoder per seed (evaluation.probes.random_init_model)
    assert _key(tiny_config(decoder_width=16, decoder_depth=2)) == key
    for changed in (dict(seed=1), dict(encoder_width=32), dict(encoder_depth=2),
                    dict(test_limit=12),
                    {"eval.knn_ks": (3,)}, {"eval.finetune_steps": 4}):
        assert _key(tiny_config(**changed)) != key, changed
    data = prepare_data(reference)
    labels = data.test_labels.clone()  # the loaded dataset is cached and shared: never written to
    labels[0] = (labels[0] + 1) % 10  # one label
    assert _key(reference, dataclasses.replace(data, test_labels=labels)) != key


def test_a_second_cell_reads_the_baselines_the_first_computed_and_they_are_equal(tmp_path):
    first, second = tiny_config(mask_ratio=0.75), tiny_config(mask_ratio=0.5)
    cache = BaselineCache(tmp_path / "baselines")
    models = {}
    for config in (first, second):
        data = prepare_data(config)
        models[config.mask_ratio] = train(config, data).model
    data = prepare_data(first)
    computed = probe_metrics(models[0.75], first, data, baselines=cache, **FINETUNE)
    (key, how), = cache.outcomes
    assert how == "computed" and (tmp_path / "baselines" / f"{key}.json").exists()
    read = probe_metrics(models[0.5], second, prepare_data(second), baselines=cache, **FINETUNE)
    assert cache.outcomes[-1] == (key, "reused")
    alone = probe_metrics(models[0.5], second, prepare_data(second), **FINETUNE)  # no cache at all
    assert read == alone  # every metric, the baselines read from the file included
    baselines = {name for name in computed if is_baseline_metric(name)}
    assert {"random_probe_linear_acc", "pixel_probe_knn_k", "random_finetune_acc",
            "scratch_best_finetune_steps"} <= baselines
    assert not {"probe_linear_acc", "finetune_acc"} & baselines
    assert {name: computed[name] for name in baselines} == {name: read[name] for name in baselines}
    stored = json.loads((tmp_path / "baselines" / f"{key}.json").read_text())["metrics"]
    assert set(stored) == baselines


def test_another_seed_computes_its_own(tmp_path):
    cache = BaselineCache(tmp_path)
    for config in (tiny_config(), tiny_config(seed=1)):
        model = random_init_model(config)
        probe_metrics(model, config, prepare_data(config), baselines=cache)
    assert [how for _, how in cache.outcomes] == ["computed", "computed"]
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_two_trials_asking_at_once_compute_a_key_once(tmp_path):
    import threading
    import time

    calls, started = [], threading.Event()

    def compute():
        calls.append(1)
        started.set()
        time.sleep(0.3)  # the other asks meanwhile
        return {"random_probe_linear_acc": 0.5}

    caches = [BaselineCache(tmp_path), BaselineCache(tmp_path)]
    first = threading.Thread(target=caches[0].get_or_compute, args=("k", compute))
    first.start()
    started.wait()
    assert caches[1].get_or_compute("k", compute) == {"random_probe_linear_acc": 0.5}
    first.join()
    assert len(calls) == 1
    assert [c.outcomes for c in caches] == [[("k", "computed")], [("k", "reused")]]
