"""Config: good defaults, and every bad value is a ConfigError (a ValueError) naming its key."""

import re

import pytest
from pydantic import ValidationError

from conftest import tiny_config
from mae_core import Config, ConfigError

BAD = [  # (keys, the key the one-line message must name)
    (dict(mask_ratio=0), "mask_ratio"),
    (dict(mask_ratio=1), "mask_ratio"),
    (dict(mask_ratio=-0.1), "mask_ratio"),
    (dict(mask_ratio=1.5), "mask_ratio"),
    (dict(mask_ratio=0.99), "mask_ratio"),  # M=16: k = int(16·0.01) = 0 visible patches
    (dict(mask_ratio=0.95), "mask_ratio"),  # k = int(0.8) = 0
    (dict(patch_size=3), "patch_size"),  # 3 does not divide 8
    (dict(patch_size=0), "patch_size"),
    (dict(dataset="shapes", patch_size=3), "patch_size"),
    (dict(objective="vae"), "objective"),
    (dict(target="foo"), "target"),
    (dict(corruption="blur", objective="dae"), "corruption"),
    (dict(corruption="gaussian"), "corruption"),  # a corruption with objective=mae
    (dict(objective="dae", corruption="none"), "corruption"),
    (dict(objective="dae", corruption="masking", corruption_level=1.5), "corruption_level"),
    (dict(mask_sampling="checkerboard"), "mask_sampling"),
    (dict(dataset="mnist"), "dataset"),
    (dict(dataset="npz:/no/such/file.npz"), "dataset"),
    (dict(mask_ration=0.5), "mask_ration"),  # unknown key
    (dict(lr=0), "lr"),
    (dict(lr=-1), "lr"),
    (dict(steps=-1), "steps"),
    (dict(steps="abc"), "steps"),
    (dict(batch_size=0), "batch_size"),
    (dict(batch_size=2.5), "batch_size"),
    (dict(encoder_width=20, encoder_heads=3), "encoder_width"),
    (dict(decoder_width=12, decoder_heads=8), "decoder_width"),
    (dict(encoder_width=18, encoder_heads=2), "encoder_width"),  # sincos needs a multiple of 4
    (dict(mask_token_in_encoder=True, objective="ae"), "mask_token_in_encoder"),
    (dict(optimizer="lamb"), "optimizer"),
    (dict(warmup_fraction=1.0), "warmup_fraction"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(warmup_steps=300, steps=200), "warmup_steps"),  # a warm-up longer than the run
    (dict(seed=-1), "seed"),
    (dict(encoder="bogus"), "encoder"),
    (dict(encoder="timm:no_such_vit"), "encoder"),  # names timm's problem: not installed, or no such ViT
]


@pytest.mark.parametrize("keys, key", BAD, ids=[",".join(f"{k}={v!r}" for k, v in keys.items()) for keys, _ in BAD])
def test_bad_value_raises_config_error_naming_the_key(keys, key):
    with pytest.raises(ConfigError) as err:
        Config(**keys)
    assert isinstance(err.value, ValueError)
    message = str(err.value)
    assert re.search(rf"(?<!\w){key}(?!\w)", message), message  # the key as a whole word
    assert "\n" not in message


def test_defaults():
    config = Config()
    assert (config.dataset, config.objective, config.target, config.mask_sampling) == ("digits", "mae", "raw", "random")
    assert config.resolved_patch_size == 2 and config.image_shape == (1, 8, 8)
    assert config.num_patches == 16 and config.patch_dim == 4
    assert config.num_visible == 4 and config.effective_mask_ratio == 0.75
    assert config.num_visible_sets == 1820
    assert config.actual_lr == pytest.approx(config.lr * 128 / 256)
    assert config.resolved_corruption == "none"


@pytest.mark.parametrize("keys, m, q, k", [
    (dict(dataset="shapes"), 16, 16, 4),
    (dict(dataset="photos"), 64, 48, 16),
    (dict(patch_size=4, mask_ratio=0.5), 4, 16, 2),
    (dict(mask_ratio=0.9), 16, 4, 1),  # int(1.6) = 1: the effective ratio is 15/16
    (dict(objective="ae"), 16, 4, 16),  # the AE and DAE see every patch
])
def test_derived_grid_quantities(keys, m, q, k):
    config = Config(**keys)
    assert (config.num_patches, config.patch_dim, config.num_visible) == (m, q, k)
    assert config.effective_mask_ratio == (m - k) / m
    assert config.resolved()["num_visible"] == k


def test_dae_defaults_to_gaussian_and_sgd_uses_lr_itself():
    assert Config(objective="dae").resolved_corruption == "gaussian"
    assert Config(optimizer="sgd", lr=0.1, batch_size=64).actual_lr == 0.1


def test_cli_strings_are_coerced_and_config_is_frozen():
    config = Config(mask_ratio="0.5", steps="10", class_token="true")
    assert (config.mask_ratio, config.steps, config.class_token) == (0.5, 10, True)
    with pytest.raises(ValidationError):  # frozen: assignment is refused
        config.steps = 3


def test_with_updates_revalidates():
    config = tiny_config()
    assert config.with_updates(mask_ratio=0.5).num_visible == 8
    with pytest.raises(ConfigError, match="mask_ratio"):
        config.with_updates(mask_ratio=0.99)


def test_compile_auto_turns_on_only_for_long_runs():
    from mae_core.config import COMPILE_AUTO_MIN_STEPS

    assert Config().compile == "auto" and not Config(device="cpu").compile_enabled  # never in short runs or tests
    assert Config(steps=COMPILE_AUTO_MIN_STEPS).compile_enabled
    assert not Config(steps=COMPILE_AUTO_MIN_STEPS, compile="false").compile_enabled
    assert Config(steps=10, compile="true").compile_enabled
    assert Config(steps=10).resolved()["compile_enabled"] is False


def test_compile_auto_break_even_depends_on_the_device_class():
    """A pure rule of device type and run length: the CPU's 20,000 updates, CUDA's 1,750 (issue 26's
    ViT-B/16 figure); no GPU is needed to check either."""
    from mae_core.config import COMPILE_AUTO_MIN_STEPS, COMPILE_AUTO_MIN_STEPS_CUDA, compile_pays_off

    assert (COMPILE_AUTO_MIN_STEPS, COMPILE_AUTO_MIN_STEPS_CUDA) == (20_000, 1_750)
    for device, break_even in (("cpu", 20_000), ("cuda", 1_750)):
        assert not compile_pays_off(device, break_even - 1) and compile_pays_off(device, break_even)
    assert not compile_pays_off("cpu", 2_000) and compile_pays_off("cuda", 2_000)  # the default J
    # issue 36: the default digits model in a CUDA graph stays uncompiled; uncaptured, the fallback
    assert not Config(steps=2_000, device="cuda").compile_enabled and not Config(steps=2_000, device="cpu").compile_enabled
    assert Config(steps=2_000, cuda_graph="false").compile_enabled_on("cuda")
    assert Config(steps=2_000).compile_enabled_on("cuda", graph=False) and not Config(steps=2_000).compile_enabled_on("cpu")
    wide = dict(encoder_width=768, encoder_heads=12, steps=2_000)  # ViT-B's width: the fallback on CUDA
    assert Config(**wide).compile_enabled_on("cuda") and Config(**wide, device="cuda").resolved()["compile_enabled"] is True
    assert not Config(steps=50_000, compile="false").compile_enabled_on("cuda")
    assert Config(steps=10, compile="true").compile_enabled_on("cpu")


def test_every_key_has_a_description_and_the_catalogue_lists_them_all():
    """The unit and meaning live in each field's description; ``mae-study config`` reads them."""
    from mae_core.config import EvalConfig, config_keys

    fields = {**{k: f for k, f in Config.model_fields.items() if k != "eval"},
              **{f"eval.{k}": f for k, f in EvalConfig.model_fields.items()}}
    assert all(field.description for field in fields.values()), [k for k, f in fields.items() if not f.description]
    catalogue = {key.name: key for key in config_keys()}
    assert list(catalogue) == list(fields)
    assert all(catalogue[name].default == field.default for name, field in fields.items())


@pytest.mark.parametrize("key, allowed", [
    ("mask_ratio", "number in (0, 1)"), ("warmup_fraction", "number in [0, 1)"), ("lr", "number > 0"),
    ("steps", "integer ≥ 0"), ("train_limit", "integer ≥ 1 | null"), ("objective", "mae | ae | dae"),
    ("corruption", "none | gaussian | masking | salt_pepper | null"), ("class_token", "true | false"),
    ("compile", "auto | true | false"), ("dataset", "text"), ("eval.finetune_blocks", "integer ≥ 0 | all | null"),  # all: MAE Fig. 9 full fine-tuning
    ("eval.features", "auto | mean | cls | both"), ("eval.finetune_layer_decay", "number in (0, 1]"),
])
def test_allowed_values_are_read_from_the_types(key, allowed):
    from mae_core.config import config_keys

    assert {k.name: k.allowed for k in config_keys()}[key] == allowed


def test_the_config_module_imports_no_torch():
    """``mae-study --help`` and ``mae-study config`` read the fields: they must start fast."""
    import subprocess
    import sys

    code = "import sys, mae_core, mae_core.config; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_encoder_timm_without_timm_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ModuleNotFoundError
    with pytest.raises(ConfigError, match=r"^encoder='timm:vit_tiny_patch16_224': timm is not installed: "
                                          r"pip install 'mae-study\[timm\]'$"):
        Config(encoder="timm:vit_tiny_patch16_224")
