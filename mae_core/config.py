"""One typed configuration: every key, default, unit and allowed range in one place.

Users type these keys as ``key=value`` on the CLI or in a YAML file; a study states only the
keys it changes. Unknown keys and bad values raise :class:`ConfigError` (a ``ValueError``)
with one line naming the key and what is allowed. Each field's ``description`` is its unit and
meaning, and :func:`config_keys` lists every key with its default and allowed range (what
``mae-study config`` prints).

This module imports no torch: the engine modules it checks against (data, masking, patches)
are imported inside the checks, so ``mae-study --help`` and ``mae-study config`` start fast.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from . import registry
from .compile_policy import FALLBACK_MIN_UPDATES, decide, fallback_compiles
from .errors import UserError, first_problem, shown
from .evaluator import expand, validate_settings

# compile="auto" decides from measured compile cost and per-update gain where one is recorded
# (mae_core.compile_policy, issue 36), else from these run lengths. torch.compile costs 40-60 s
# on a cold cache (5 s warm) and saved about 10% of a step on the digits model on the CPU
# (``mae-study bench``: compile_break_even_steps); from this many updates on it pays even cold.
COMPILE_AUTO_MIN_STEPS = FALLBACK_MIN_UPDATES["cpu"]
# On CUDA issue 26 reports that a ViT-B/16 MAE (224 px, batch 256, bf16) on an H200 pays its
# compilation back after about 1,750 updates (measured by the author, not in this
# repository).
COMPILE_AUTO_MIN_STEPS_CUDA = FALLBACK_MIN_UPDATES["cuda"]


def compile_pays_off(device_type: str, steps: int) -> bool:
    """The fallback rule of ``compile=auto`` (no measurement recorded): compile a run of
    ``steps`` updates on ``device_type`` (``"cpu"``, ``"cuda"``) once it reaches that device
    class's run length; any device other than CUDA keeps the CPU's."""
    return fallback_compiles(device_type, steps)


class ConfigError(UserError):
    """A configuration key has a value outside what is allowed (one line, names the key)."""


def _one_line(error: ValidationError) -> str:
    key, kind, message, value = first_problem(error)
    key = key or "config"
    if kind == "extra_forbidden":
        if key.startswith(f"{EVAL_PREFIX}."):
            allowed = ", ".join(f"{EVAL_PREFIX}.{name}" for name in sorted(EvalConfig.model_fields))
        else:
            allowed = ", ".join(sorted(Config.model_fields))
        return f"unknown key {shown(key)}; known keys: {allowed}"
    if key == EVAL_PREFIX:  # a consistency check of EvalConfig: its message names the keys
        return message
    if kind == "literal_error" or key == "config":
        return f"{key}: {message}" if key != "config" else message
    return f"{key}={shown(value)}: {message}"


EVAL_PREFIX = "eval"  # ``eval.fewshot=4`` on the command line, ``eval: {fewshot: 4}`` in YAML

# The sources of noise a trial has, each its own key (None: ``seed``), and the Config property
# holding the seed it resolves to.
SEED_SOURCES = {"seed_data": "data_seed", "seed_init": "init_seed", "seed_masks": "masks_seed",
                "seed_eval": "eval_seed"}


def listable_evaluators() -> list[str]:
    """The evaluators ``eval.evaluators`` may name: every registered one but those that run during
    training (``online``), which ``eval.every`` switches on instead."""
    return [name for name in registry.evaluators.names() if not registry.evaluators.get(name).during_training]


class EvalConfig(BaseModel):
    """How a trained encoder is evaluated downstream: the probes' and fine-tuning's settings.

    Nested in :class:`Config` as ``eval``; logged as ``eval.<key>`` params, so two runs with
    different probe settings never look alike in MLflow.
    """

    # extra="allow" only for the evaluators' own keys, ``eval.<name>.<key>``: every other key
    # unknown to the fields below is refused by _evaluator_settings (one line naming it).
    model_config = ConfigDict(extra="allow", frozen=True, validate_default=True)

    fewshot: int = Field(8, ge=1, description="labelled examples per class for the few-shot probe")
    fewshot_draws: int = Field(5, ge=1, description="seeded draws of those examples, averaged")
    # Every choice a probe makes is made on a validation split carved from the training split
    # (seeded by ``seed``); the test split is read once, after the chosen setting is refitted
    # on the whole training split.
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0,
                                description="share of the training split held out for the probes' choices")
    linear_cs: tuple[float, ...] = Field((0.01, 0.1, 1.0, 10.0, 100.0),
                                         description="logistic-regression C tried (linear, few-shot)")
    knn_ks: tuple[int, ...] = Field((1, 5, 10, 20, 50),
                                    description="kNN neighbour counts tried (capped at the training size)")
    # What the frozen probes read (linear, few-shot, kNN; fine-tuning reads the model's own
    # features, as MAE fine-tunes on pooled tokens). MAE's linear probe reads the class token.
    features: Literal["auto", "mean", "cls", "both"] = Field(
        "auto", description="probe features: mean-pooled tokens, class token, or both; "
                            "auto = both with class_token, mean without; cls and both need class_token")
    # Layer-wise probes (MultiMAE, SimMIM: the best probing depth is often not the last): the
    # same frozen probes, choices and pooling on the tokens after the first b blocks, with the
    # encoder's final LayerNorm applied (DINOv2's get_intermediate_layers(norm=True)), so
    # b = encoder_depth is the final-layer probe itself.
    probe_blocks: tuple[int, ...] = Field(
        (), description="also probe the features after these encoder blocks (1-based counts in "
                        "[1, encoder_depth], final norm applied): probe_*_acc_block<b>; empty = none")
    # The linear probe's head: today's standardised logistic regression, or MAE's
    # main_linprobe.py head (BatchNorm without affine, then linear) trained by SGD with momentum
    # 0.9, warm-up and cosine; its base step size is chosen on the validation split. The
    # few-shot probe keeps logistic regression (BatchNorm statistics of a few images per class).
    linear_head: Literal["logreg", "bn_linear"] = Field(
        "logreg", description="linear probe head: logreg (C from linear_cs) | bn_linear (MAE: BatchNorm + linear, SGD)")
    # MAE's 0.1 is LARS's (a step relative to each weight's norm); plain SGD on BatchNorm-ed
    # features chose 1.0 on digits, so the grid reaches past it.
    bn_linear_lrs: tuple[float, ...] = Field(
        (0.01, 0.1, 1.0, 10.0), description="bn_linear: SGD base step sizes tried, per 256 images (actual = lr·batch/256)")
    bn_linear_epochs: int = Field(90, ge=1, description="bn_linear: passes over the training split (MAE: 90)")
    bn_linear_warmup_epochs: int = Field(
        10, ge=0, description="bn_linear: epochs of linear warm-up before the cosine decay (MAE: 10)")
    bn_linear_batch_size: int = Field(
        256, ge=2, description="bn_linear: images per SGD step (at least 2: BatchNorm needs a batch)")
    bn_linear_weight_decay: float = Field(
        0.0, ge=0.0, description="bn_linear: weight decay of the linear layer (MAE: 0)")
    finetune_steps: int = Field(0, ge=0, description="fine-tuning minibatches; 0 = no fine-tuning")
    finetune_blocks: NonNegativeInt | Literal["all"] | None = Field(
        None, description="also fine-tune only the last n blocks (MAE Fig. 9); all = every encoder weight")
    finetune_shots: int | None = Field(
        None, ge=1, description="fine-tune on n examples per class, not the whole split")
    finetune_lr: float = Field(1e-3, gt=0.0, description="AdamW peak step size of fine-tuning")
    finetune_batch_size: int = Field(64, ge=1, description="images per fine-tuning minibatch")
    # MAE's fine-tuning recipe (He et al. A.1; util/lr_decay.py): block i of d learns at
    # decay^(d-i) times the step size, the embeddings at decay^(d+1), the head at 1. Applied to
    # the pretrained encoder only; training from scratch has nothing to preserve (1.0 there).
    finetune_layer_decay: float = Field(
        1.0, gt=0.0, le=1.0, description="layer-wise step-size decay of fine-tuning (MAE: 0.75); 1 = off")
    finetune_warmup_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="fine-tuning: linear warm-up over this fraction of its updates")
    finetune_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="fine-tuning step size after warm-up (MAE: cosine)")
    # A plain linear head on unnormalised features learns at the pace of their scale (on
    # digits it stayed near chance for 200 updates with the encoder frozen); MAE's linear-probe
    # head normalises them first, which Figure 9's "0 blocks" point (the linear probe) reads.
    finetune_head: Literal["linear", "bn_linear"] = Field(
        "linear", description="fine-tuning's head: linear | bn_linear (MAE: BatchNorm without affine, then linear)")
    # Fine-tuning with its own budget, for the from-scratch baseline and the pretrained model
    # alike (one grid, one selection): trained on the training split minus the validation
    # split, scored on validation every ``scratch_eval_every`` updates up to
    # ``scratch_max_steps``; the best count is refitted on the whole training split.
    scratch_max_steps: int | None = Field(
        None, ge=1, description="longest fine-tuning run tried for the tuned lengths (from scratch and "
                                "pretrained); None = 4 x finetune_steps")
    scratch_eval_every: int | None = Field(
        None, ge=1, description="updates between validation scores of the tuned-length search; "
                                "None = finetune_steps // 2")
    # Online evaluation: the learning curve of one run (kNN accuracy and masked risk every N
    # updates, step = update), so a curve over lengths needs no run per length. The trainer only
    # says when (mae_core.train); what is measured is evaluation.online's.
    every: int = Field(0, ge=0, description="updates between online evaluations (online_knn_acc, "
                                            "online_mae_risk histories, step = update); 0 = off")
    online_images: int = Field(256, ge=2, description="images in each fixed subset the online evaluation "
                                                      "reads (kNN references, kNN queries, masked-risk images)")
    # What a trained model is measured by, in order (as big_vision's config lists its
    # evaluators): the built-ins of evaluation.evaluators and any plugin's @evaluator.
    evaluators: tuple[str, ...] = Field(
        ("risks", "probes"), description="evaluators run after training, in order: risks (the spec's test "
                                         "risks), probes (= frozen_probes, layer_probes, finetune: probes, "
                                         "fine-tuning, their baselines), a plugin's",
        json_schema_extra={"registry": "evaluators"})

    # Evaluation noise averaged away inside a trial (issue 35): the evaluators run K times, with
    # seed_eval, seed_eval+1, ...; each metric logged is the mean, <metric>_sd the spread.
    repeats: int = Field(1, ge=1, description="evaluations per trial, seeded seed_eval, seed_eval+1, ...: each "
                                              "metric is their mean, <metric>_sd their standard deviation "
                                              "(logged when repeats > 1)")

    @model_validator(mode="before")
    @classmethod
    def _evaluator_settings(cls, data: Any) -> Any:
        """``eval.<name>.<key>`` (CLI: the key ``<name>.<key>`` here; YAML: ``<name>: {key: ...}``)
        -> validated by evaluator ``name``'s ``Settings`` (:mod:`mae_core.evaluator`) and kept as
        ``<name>: {key: value}``; for a built-in whose keys predate it (``flat_keys``), an alias
        of ``eval.<key>``. Any other key unknown to the fields is refused, naming it."""
        if not isinstance(data, dict):
            return data
        data, grouped = dict(data), {}
        for key in [key for key in data if key not in cls.model_fields]:
            value = data.pop(key)
            name, dot, sub = str(key).partition(".")
            if dot and name not in cls.model_fields:
                grouped.setdefault(name, {})[sub] = value
            elif not dot and isinstance(value, dict):
                grouped.setdefault(name, {}).update(value)
            else:
                raise ValueError(_unknown_eval_key(str(key)))
        for name, values in grouped.items():
            if name not in registry.evaluators.names():
                raise ValueError(_unknown_eval_key(f"{name}.{next(iter(values), '')}".rstrip(".")))
            validate_settings(name, values)
            if getattr(registry.evaluators.get(name).evaluator_class, "flat_keys", False):
                for sub, value in values.items():
                    if sub in data and str(data[sub]) != str(value):
                        raise ValueError(f"{EVAL_PREFIX}.{name}.{sub}={shown(value)} and {EVAL_PREFIX}.{sub}="
                                         f"{shown(data[sub])} differ: they are one key")
                    data[sub] = value
            elif values:
                data[name] = values
        return data

    def evaluator_settings(self) -> dict[str, dict[str, Any]]:
        """The ``eval.<name>.*`` keys given to evaluators with keys of their own: name -> keys."""
        return dict(self.model_extra or {})

    def flat(self) -> dict[str, Any]:
        """Every key as ``eval.<key>`` or ``eval.<name>.<key>`` (the params a run logs)."""
        values = {f"{EVAL_PREFIX}.{k}": v for k, v in self.model_dump().items() if k in EvalConfig.model_fields}
        for name, keys in self.evaluator_settings().items():
            values.update({f"{EVAL_PREFIX}.{name}.{k}": v for k, v in keys.items()})
        return values

    @field_validator("evaluators", mode="before")
    @classmethod
    def _evaluator_list(cls, value: Any) -> Any:
        """``"risks,probes"`` (CLI, YAML) or one name -> a tuple; lists pass through."""
        if isinstance(value, str):
            return tuple(part for part in value.strip("[]() ").replace(",", " ").split() if part)
        return value

    @field_validator("evaluators", mode="after")
    @classmethod
    def _known_evaluators(cls, value: tuple) -> tuple:
        """Registered names (built-in or a loaded plugin's), each once, at least one."""
        if not value:
            raise ValueError(f"needs at least one of {registry.evaluators.allowed()}")
        listable = listable_evaluators()
        unknown = [name for name in value if name not in listable]
        if unknown:
            raise ValueError(f"{', '.join(unknown)} not one of {', '.join(listable)}")
        expanded = expand(value)  # probes: frozen_probes, layer_probes, finetune
        if len(set(expanded)) != len(expanded):
            raise ValueError("lists an evaluator twice" + ("" if len(set(value)) != len(value) else
                                                           f" (it runs {', '.join(expanded)})"))
        return value

    @field_validator("linear_cs", "knn_ks", "bn_linear_lrs", mode="before")
    @classmethod
    def _grid_from_text(cls, value: Any) -> Any:
        """``"0.1,1,10"`` (CLI, YAML) or one number -> a tuple; lists pass through."""
        if isinstance(value, str):
            return tuple(part for part in value.replace(",", " ").split() if part)
        if isinstance(value, (int, float)):
            return (value,)
        return value

    @field_validator("linear_cs", "knn_ks", "bn_linear_lrs", mode="after")
    @classmethod
    def _grid_values(cls, value: tuple) -> tuple:
        """Non-empty, every value positive (finite C, k >= 1); sorted and without repeats, so a
        tie on the validation split goes to the first (the smallest) value."""
        if not value:
            raise ValueError("needs at least one value")
        if any(not (v > 0 and math.isfinite(v)) for v in value):
            raise ValueError("every value must be positive and finite")
        return tuple(sorted(set(value)))

    @field_validator("probe_blocks", mode="before")
    @classmethod
    def _block_list(cls, value: Any) -> Any:
        """``[2,4]``, ``"2,4"``, ``"[2, 4]"``, ``2``, null or ``[]`` -> ascending distinct block counts ≥ 1."""
        if value is None:
            return ()
        parts = value.strip("[]() ").replace(",", " ").split() if isinstance(value, str) else (
            [value] if isinstance(value, int) else value)
        try:
            blocks = [int(str(part).strip()) for part in parts if not isinstance(part, bool)]
        except (TypeError, ValueError):
            blocks = None
        if blocks is None or len(blocks) != len(list(parts)) or any(b < 1 for b in blocks):
            raise ValueError("must be a list of encoder block counts ≥ 1, e.g. [2,4]")
        return tuple(sorted(set(blocks)))

    @field_validator("finetune_blocks", mode="before")
    @classmethod
    def _block_count(cls, value: Any) -> Any:
        """A block count ≥ 0 (``2``, ``"2"``), ``all`` or None; one plain message for anything else."""
        if value is None or value == "all":
            return value
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit():
            raise ValueError("must be a block count ≥ 0, all or null")
        return int(text)

    @model_validator(mode="after")
    def _check_consistency(self) -> EvalConfig:
        # A fine-tuning setting without fine-tuning would be silently ignored: refused instead.
        off = {"finetune_blocks": None, "scratch_max_steps": None, "scratch_eval_every": None,
               "finetune_layer_decay": 1.0, "finetune_warmup_fraction": 0.0, "finetune_schedule": "constant",
               "finetune_head": "linear"}
        for key, unset in off.items():
            if getattr(self, key) != unset and self.finetune_steps <= 0:
                raise ValueError(f"{EVAL_PREFIX}.{key}={getattr(self, key)} needs "
                                 f"{EVAL_PREFIX}.finetune_steps > 0")
        if self.online_images != EvalConfig.model_fields["online_images"].default and self.every <= 0:
            raise ValueError(f"{EVAL_PREFIX}.online_images={self.online_images} needs {EVAL_PREFIX}.every > 0")
        if self.bn_linear_warmup_epochs >= self.bn_linear_epochs:
            raise ValueError(f"{EVAL_PREFIX}.bn_linear_warmup_epochs={self.bn_linear_warmup_epochs} must be "
                             f"below {EVAL_PREFIX}.bn_linear_epochs={self.bn_linear_epochs}")
        return self

    @property
    def resolved_scratch_max_steps(self) -> int:
        """The cap of the tuned-length search (updates), pretrained and from scratch."""
        return self.scratch_max_steps if self.scratch_max_steps is not None else 4 * self.finetune_steps

    @property
    def scratch_candidates(self) -> tuple[int, ...]:
        """Update counts fine-tuning is scored at on the validation split, the same for the
        pretrained model and the from-scratch baseline: multiples of ``scratch_eval_every`` up
        to the cap, and the cap itself."""
        cap = self.resolved_scratch_max_steps
        every = self.scratch_eval_every if self.scratch_eval_every is not None else max(1, self.finetune_steps // 2)
        return tuple(sorted({*range(every, cap + 1, every), cap}))


def _unknown_eval_key(key: str) -> str:
    known = ", ".join(f"{EVAL_PREFIX}.{name}" for name in sorted(EvalConfig.model_fields))
    return f"unknown key {shown(f'{EVAL_PREFIX}.{key}')}; known keys: {known}"


def nest_eval_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """``{"eval.fewshot": 4, "eval": {...}}`` -> ``{"eval": {..., "fewshot": 4}}`` (dotted keys win)."""
    nested = dict(keys.get(EVAL_PREFIX) or {})
    if isinstance(nested, EvalConfig):
        nested = nested.model_dump(exclude_unset=True)
    flat = {}
    for key, value in keys.items():
        if key.startswith(f"{EVAL_PREFIX}."):
            nested[key.removeprefix(f"{EVAL_PREFIX}.")] = value
        elif key != EVAL_PREFIX:
            flat[key] = value
    return {**flat, EVAL_PREFIX: nested} if nested or EVAL_PREFIX in keys else flat


def _source_seed_property(key: str, what: str) -> property:
    """``Config.data_seed`` and its kin: ``key``, else ``seed``."""
    return property(lambda config: config.source_seed(key), doc=f"``{key}``, else ``seed``: {what}.")


class Config(BaseModel):
    """Everything one trial needs. Units and reasons are in each field's description
    (``mae-study config`` prints them with the defaults and allowed ranges)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    # data
    dataset: str = Field("digits", description=" | ".join(
        ("digits", "shapes", "photos", "fashion_mnist",
         *(f"{kind}:PATH" for kind in registry.dataset_formats.names()))))
    train_limit: int | None = Field(None, ge=1, description="use at most this many training images (smoke runs)")
    test_limit: int | None = Field(None, ge=1, description="evaluate on at most this many test images")
    patch_size: int | None = Field(None, ge=1, description="pixels per patch side P; None = the dataset's default")
    # Images are stored as bytes and converted per batch either way; the ceiling only decides
    # where they are read from, never a number a run produces.
    data_ram_mb: int = Field(
        4096, ge=0, description="MB of images a trial reads into memory at most; a larger dataset "
        "stays on disk (memory-mapped, or files decoded per batch)")
    augment: Literal["none", "crop_flip"] = Field(
        "none", description="crop_flip: He et al.'s RandomResizedCrop (scale 0.2-1) + flip per "
        "batch, outside the spec's procedure")

    # objective (spec: MAE masked risk; AE reconstruction risk; DAE denoising risk)
    objective: str = Field(
        "mae", description="mae: masked risk; ae: reconstruction risk; dae: denoising risk",
        json_schema_extra={"registry": "objectives"})
    mask_ratio: float = Field(0.75, gt=0.0, lt=1.0, description="ρ; visible count k = int(M·(1-ρ))")
    mask_sampling: str = Field("random", description="random = the spec's Uniform(V_k)",
                               json_schema_extra={"registry": "mask_samplers"})
    mask_token_in_encoder: bool = Field(False, description="MAE Table 1c ablation, outside the spec")
    target: str = Field("raw", description="norm = spec's strict T_norm", json_schema_extra={"registry": "targets"})
    corruption: str | None = Field(
        None, description="None: gaussian for dae, none otherwise", json_schema_extra={"registry": "corruptions"})
    corruption_level: float = Field(
        0.2, ge=0.0, description="gaussian: noise std in pixel units; others: fraction of pixels")
    corruption_copies: int = Field(
        4, ge=1, description="K copies per test image in the finite law for test_den_risk")

    # model (ViT encoder; transformer decoder)
    encoder: str = Field("vit", description=(
        "vit (built-in) | timm:NAME, a timm VisionTransformer design such as timm:vit_tiny_patch16_224 "
        "(random init; pip install 'mae-study[timm]'); its size is still encoder_width/depth/heads"))
    encoder_width: int = Field(64, ge=4, description="D, token width")
    encoder_depth: int = Field(4, ge=1, description="transformer blocks")
    encoder_heads: int = Field(4, ge=1, description="attention heads per encoder block; divides encoder_width")
    decoder_width: int = Field(32, ge=4, description="decoder token width")
    decoder_depth: int = Field(2, ge=1, description="decoder transformer blocks")
    decoder_heads: int = Field(4, ge=1, description="attention heads per decoder block; divides decoder_width")
    mlp_ratio: float = Field(4.0, gt=0.0, description="MLP hidden width / token width")
    latent_dim: int = Field(32, ge=1, description="Z, the AE/DAE bottleneck width")
    class_token: bool = Field(False, description="prepend a class token (its output joins the probe features)")
    pos_embed: Literal["sincos", "learned"] = Field("sincos", description="fixed 2-D sine-cosine by default")

    # optimisation (spec: the update schedule U_t)
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw", description="adamw: He et al. A.1 (β=0.9/0.95); sgd: plain θ - η_t g")
    lr: float = Field(
        2e-3, gt=0.0, description="adamw: base lr per 256 images, actual = lr·batch_size/256; sgd: η itself")
    weight_decay: float = Field(0.05, ge=0.0, description="adamw only; never on norms, biases, tokens, positions")
    schedule: Literal["cosine", "constant"] = Field("cosine", description="step size after warm-up")
    warmup_fraction: float = Field(0.05, ge=0.0, lt=1.0, description="linear warm-up over this fraction of steps")
    warmup_steps: NonNegativeInt | None = Field(
        None, description="linear warm-up over this many updates whatever the length (replaces warmup_fraction; "
                          "with schedule=constant a study over lengths then reads its shorter ones from the longest)")
    batch_size: int = Field(
        128, ge=1, description="B (image, mask) pairs per step; B=1 is the spec's literal loop")
    steps: int = Field(2000, ge=0, description="J updates")
    seed: int = Field(0, ge=0, description="seeds data split, initialisation, I_t and V_t, and the evaluation "
                                           "(each source's seed_* key, when set, replaces it there)")
    # The noise split by source (issue 35, Bouthillier et al. 2021): each source draws from its
    # own seed, which is ``seed`` unless set, so a config that sets none of them is the config it
    # always was (the same numbers, bit for bit). ``mae-study variance`` varies one at a time.
    seed_data: NonNegativeInt | None = Field(
        None, description="seeds the data split (a pool's 80/20 split, shapes, photo blocks; a dataset with its "
                          "own test split is never re-split); null = seed")
    seed_init: NonNegativeInt | None = Field(
        None, description="seeds the model's initialisation (and the random-init baseline's encoder); null = seed")
    seed_masks: NonNegativeInt | None = Field(
        None, description="seeds the training draws: I_t, V_t, crops and the DAE's noise; null = seed")
    seed_eval: NonNegativeInt | None = Field(
        None, description="seeds the evaluation: probes' validation split, few-shot draws, fine-tuning's head and "
                          "batch order, the test risks' Monte Carlo masks and corruption copies; null = seed")

    # evaluation and bookkeeping
    risk_exact_budget: int = Field(5000, ge=1, description="enumerate V_k when C(M,k) is at most this")
    risk_mc_masks: int = Field(32, ge=2, description="otherwise: Monte Carlo masks per test image")
    log_every: int = Field(50, ge=1, description="steps between train_loss records")
    checkpoint_every: int = Field(500, ge=0, description="steps between checkpoints; 0 = only at the end")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train; auto = CUDA if available")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="forward pass; auto = bf16 on CUDA, fp32 on the CPU")
    compile: Literal["auto"] | bool = Field(
        "auto", description="torch.compile; auto: where updates × measured gain per update exceed the measured "
                            f"compile cost; unmeasured: runs of >= {COMPILE_AUTO_MIN_STEPS} updates on the CPU, "
                            f">= {COMPILE_AUTO_MIN_STEPS_CUDA} on CUDA, never a small model in a CUDA graph")
    # Issue 26: a small model's update is launch-bound on CUDA (the digits default: 846 aten
    # calls, 412 kernels per update), so the lever is one CUDA graph per update. The update can
    # only be captured when nothing in it reads a host value: step size and step count live on
    # the device, and I_t, V_t are drawn ahead (same sampler, same order: the same numbers).
    capturable: bool = Field(
        False, description="the update a CUDA graph can hold: step size and step count as device tensors, "
                           "AdamW capturable, I_t and V_t drawn ahead into fixed buffers (same draws, same "
                           "numbers as the eager loop); uncaptured on the CPU; objective mae | ae, augment none")
    cuda_graph: Literal["auto"] | bool = Field(
        "auto", description="capture one whole update as a CUDA graph (a captured update is capturable); auto and true "
                            "capture on CUDA for objective mae | ae, mask_sampling random | grid, precision "
                            "fp32 | bf16, optimizer adamw, augment none, images in memory; other runs stay "
                            "eager and say why")
    # The trained encoder (patches [B,M,q] -> features [B,F]) as an MLflow model of the run:
    # a study of many trials would otherwise fill the artifact store with large models unasked.
    log_model: bool = Field(True, description="log the trained encoder as an mlflow.pytorch model of the run")
    log_model_max_mb: float = Field(
        100.0, gt=0.0, description="MB; a larger encoder is not logged (the run's model_not_logged tag says why)")

    # downstream evaluation (probes and fine-tuning), as eval.<key>
    # A factory, not an instance: validating EvalConfig's evaluator names needs the evaluator
    # registry, which is still filling when evaluation.* is what imports this module first.
    eval: EvalConfig = Field(default_factory=EvalConfig, description="probe and fine-tuning settings (the eval.* keys)")

    def __init__(self, **keys: Any):
        try:
            super().__init__(**nest_eval_keys(keys))
        except ValidationError as error:
            raise ConfigError(_one_line(error)) from None

    @field_validator("objective", "target", "corruption", "mask_sampling")
    @classmethod
    def _registered(cls, value: str | None, info: Any) -> str | None:
        """One of the registry's names (built-in or a loaded plugin's): :mod:`mae_core.registry`."""
        choices = _choices(cls.model_fields[info.field_name])
        if value is not None and value not in choices.names():
            raise ValueError(f"not one of {choices.allowed()}")
        return value

    @field_validator("compile", "cuda_graph", mode="before")
    @classmethod
    def _compile_choice(cls, value: Any) -> Any:
        words = {"auto": "auto", "true": True, "false": False}
        if isinstance(value, bool) or value == "auto":
            return value
        if isinstance(value, str) and value.lower() in words:
            return words[value.lower()]
        raise ValueError("must be auto, true or false")

    @field_validator("encoder", mode="after")
    @classmethod
    def _encoder_name(cls, value: str) -> str:
        from .encoders import check_encoder

        check_encoder(value)
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> Config:
        from . import data
        from .patches import PatchSizeError, check_patch_size

        try:
            data.validate_dataset_name(self.dataset)
        except data.DataError as error:
            raise ValueError(f"dataset: {error}") from None
        try:
            check_patch_size(self.image_shape, self.resolved_patch_size)
        except PatchSizeError as error:
            raise ValueError(f"patch_size: {error}") from None
        k, m = self.num_visible, self.num_patches
        if self.objective_spec.masked and not 1 <= k <= m - 1:
            raise ValueError(
                f"mask_ratio={self.mask_ratio} gives k=int({m}·(1-ρ))={k} visible patches; "
                f"k must lie in [1, {m - 1}] for M={m}"
            )
        for part in ("encoder", "decoder"):
            width, heads = getattr(self, f"{part}_width"), getattr(self, f"{part}_heads")
            if width % heads:
                raise ValueError(f"{part}_width={width} must be divisible by {part}_heads={heads}")
            if self.pos_embed == "sincos" and width % 4:
                raise ValueError(f"{part}_width={width} must be a multiple of 4 for pos_embed=sincos")
        if self.corruption not in (None, "none") and not self.objective_spec.corrupted:
            raise ValueError(f"corruption={self.corruption} applies only to objective={_objectives(corrupted=True)}")
        if self.objective_spec.corrupted and self.corruption == "none":
            others = [name for name in registry.corruptions.names() if name != "none"]
            raise ValueError(f"objective={self.objective} needs a corruption: {', '.join(others)}")
        at_most = registry.corruptions.get(self.resolved_corruption).level_at_most
        if at_most is not None and self.corruption_level > at_most:
            raise ValueError(f"corruption_level={self.corruption_level} must be in [0, {at_most:g}] "
                             f"for {self.resolved_corruption}")
        target = registry.targets.get(self.target)
        if self.patch_dim < target.min_patch_dim:
            raise ValueError(f"target={self.target} normalises each patch and needs q >= {target.min_patch_dim} "
                             f"values per patch; patch_size={self.resolved_patch_size} gives q={self.patch_dim}")
        if self.augment != "none" and self.target == "norm":
            raise ValueError(f"augment={self.augment} with target=norm: a resized crop can hold constant "
                             "patches, where the strict T_norm is undefined; use target=norm_eps")
        if self.mask_token_in_encoder and not self.objective_spec.masked:
            raise ValueError(f"mask_token_in_encoder applies only to objective={_objectives(masked=True)}")
        # The capturable loop draws I_t and V_t ahead into fixed buffers; an objective whose draw
        # cannot be made ahead says why (capture_blocker: the DAE's corruption), and the crops are
        # drawn per update from the host sampler.
        if self.capturable and self.objective_spec.capture_blocker is not None:
            raise ValueError(f"capturable=true needs objective={_objectives(capture_blocker=None)}: "
                             f"objective={self.objective} {self.objective_spec.capture_blocker}")
        if self.capturable and self.augment != "none":
            raise ValueError(f"capturable=true needs augment=none: augment={self.augment} draws its crops "
                             "on the host per update")
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be at most steps={self.steps}")
        blocks = self.eval.finetune_blocks
        if isinstance(blocks, int) and blocks > self.encoder_depth:
            raise ValueError(f"eval.finetune_blocks={blocks} must lie in [0, {self.encoder_depth}] "
                             "(the encoder's depth) or be all")
        too_deep = [b for b in self.eval.probe_blocks if b > self.encoder_depth]
        if too_deep:
            raise ValueError(f"eval.probe_blocks={list(self.eval.probe_blocks)}: block {too_deep[0]} is outside "
                             f"[1, {self.encoder_depth}] (encoder_depth={self.encoder_depth})")
        if self.eval.features in ("cls", "both") and not self.class_token:
            raise ValueError(f"eval.features={self.eval.features} reads the class token; "
                             "set class_token=true or use eval.features=mean")
        return self

    # ---------------------------------------------------------------- derived values

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the dataset's images."""
        from . import data

        return data.dataset_image_shape(self.dataset)

    @property
    def resolved_patch_size(self) -> int:
        from . import data

        return self.patch_size if self.patch_size is not None else data.default_patch_size(self.dataset)

    @property
    def grid(self) -> tuple[int, int]:
        _, height, width = self.image_shape
        return height // self.resolved_patch_size, width // self.resolved_patch_size

    @property
    def num_patches(self) -> int:
        """M = HW/P²."""
        return self.grid[0] * self.grid[1]

    @property
    def patch_dim(self) -> int:
        """q = P²C."""
        return self.resolved_patch_size ** 2 * self.image_shape[0]

    @property
    def target_dim(self) -> int:
        """Values the decoder predicts per patch: the target's ``out_dim``, else q."""
        return registry.targets.get(self.target).width(self.patch_dim)

    @property
    def num_visible(self) -> int:
        """k = int(M·(1-ρ)) for the MAE; every patch for the AE and DAE."""
        from .masking import num_visible_for

        if not self.objective_spec.masked:
            return self.num_patches
        return num_visible_for(self.num_patches, self.mask_ratio)

    @property
    def effective_mask_ratio(self) -> float:
        """(M-k)/M, the ratio actually trained with."""
        return (self.num_patches - self.num_visible) / self.num_patches

    @property
    def num_visible_sets(self) -> int:
        """|V_k| = C(M,k)."""
        return math.comb(self.num_patches, self.num_visible)

    @property
    def resolved_corruption(self) -> str:
        if self.corruption is not None:
            return self.corruption
        return "gaussian" if self.objective_spec.corrupted else "none"

    @property
    def objective_spec(self) -> registry.Objective:
        """What the objective is (:class:`mae_core.registry.Objective`): masked, corrupted."""
        return registry.objectives.get(self.objective)

    @property
    def actual_lr(self) -> float:
        """Peak step size: He et al.'s linear scaling for adamw, η itself for sgd."""
        return self.lr * self.batch_size / 256 if self.optimizer == "adamw" else self.lr

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda``: ``device``, with ``auto`` resolved as the trainer does."""
        if self.device != "auto":
            return self.device
        import torch  # here, not at the top: ``mae-study config`` starts without torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def compile_enabled(self) -> bool:
        """Whether the trainer compiles the model on :attr:`device_type` (see :meth:`compile_enabled_on`)."""
        return self.compile_enabled_on(self.device_type)

    def compile_enabled_on(self, device_type: str, graph: bool | None = None) -> bool:
        """``compile`` itself, or for ``auto`` :func:`mae_core.compile_policy.decide` on
        ``device_type`` for this run's length and model, its update captured in a CUDA graph as
        ``graph`` says (None: as ``cuda_graph`` asks, on CUDA; the trainer passes what it did)."""
        if self.compile != "auto":
            return self.compile
        if graph is None:
            graph = device_type == "cuda" and self.cuda_graph is not False
        return decide(device_type, self.steps, encoder_width=self.encoder_width, graph=graph).compile

    @property
    def warmup_updates(self) -> int:
        """The warm-up's length in updates: ``warmup_steps`` where given, else ``warmup_fraction``
        of ``steps`` (a fraction grows with the run, so runs of different lengths differ from
        their first updates; a count does not)."""
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_fraction * self.steps)

    def source_seed(self, key: str) -> int:
        """One source's seed (``seed_data``, ``seed_init``, ``seed_masks``, ``seed_eval``): its own
        key where given, else ``seed``, so a config that names none is the one-seed config."""
        own = getattr(self, key)
        return self.seed if own is None else own

    data_seed = _source_seed_property("seed_data", "what splits the data")
    init_seed = _source_seed_property("seed_init", "what initialises the model")
    masks_seed = _source_seed_property("seed_masks", "what draws I_t, V_t (crops, the DAE's noise)")
    eval_seed = _source_seed_property("seed_eval", "what the evaluation draws from (its first repeat's)")

    def resolved_seeds(self) -> dict[str, int]:
        """Each source's seed as it is used: ``{"seed_data": ..., "seed_init": ..., ...}``."""
        return {key: getattr(self, attribute) for key, attribute in SEED_SOURCES.items()}

    def resolved(self) -> dict[str, Any]:
        """Every key with defaults resolved, plus the derived quantities a reader needs."""
        values = self.model_dump(exclude={EVAL_PREFIX})
        values.update(self.resolved_seeds())  # logged as used: seed_eval=3, never None
        values.update(self.eval.flat())
        values.update(
            patch_size=self.resolved_patch_size,
            corruption=self.resolved_corruption,
            num_patches=self.num_patches,
            patch_dim=self.patch_dim,
            num_visible=self.num_visible,
            effective_mask_ratio=self.effective_mask_ratio,
            actual_lr=self.actual_lr,
            warmup_steps=self.warmup_updates,
            compile_enabled=self.compile_enabled,
        )
        return values

    def with_updates(self, **changes: Any) -> Config:
        """A new validated config with some keys changed."""
        return Config(**{**self.model_dump(exclude_unset=True), **changes})


def parse_value(text: str) -> Any:
    """CLI text -> Python value: ``none``/``null`` become None; the rest is left to the typed fields."""
    return None if text.strip().lower() in ("none", "null") else text


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["mask_ratio=0.5", ...]`` -> ``{"mask_ratio": "0.5", ...}``; raises ConfigError on a bad pair."""
    keys: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected key=value, got {shown(pair)}")
        keys[key.strip()] = parse_value(value)
    return keys


# ----------------------------------------------------------------------- the key catalogue

# Python types as a user reads them in ``mae-study config``.
_KIND_WORDS = {int: "integer", float: "number", str: "text"}
NULL = "null"  # how None is written: YAML's word; the CLI's parse_value reads none and null


@dataclass(frozen=True)
class ConfigKey:
    """One key as a user types it: its default, what it may be, and its unit and meaning."""

    name: str  # ``mask_ratio`` or ``eval.fewshot``
    default: Any
    allowed: str  # from the field's type: choices, bounds, true | false, null
    description: str  # the field's description (unit and meaning)


def config_keys() -> list[ConfigKey]:
    """Every key of :class:`Config` in declaration order, then the ``eval.*`` keys of :class:`EvalConfig`."""
    keys = [_config_key(name, field) for name, field in Config.model_fields.items() if name != EVAL_PREFIX]
    keys += [_config_key(f"{EVAL_PREFIX}.{name}", field) for name, field in EvalConfig.model_fields.items()]
    for name in registry.evaluators.names():  # the keys of evaluators with settings of their own
        entry = registry.evaluators.get(name)
        if entry.settings is not None and not getattr(entry.evaluator_class, "flat_keys", False):
            keys += [_config_key(f"{EVAL_PREFIX}.{name}.{key}", field) for key, field in entry.settings.model_fields.items()]
    return keys


def _config_key(name: str, field: FieldInfo) -> ConfigKey:
    return ConfigKey(name, field.default, allowed_values(field), field.description or "")


def as_typed(value: Any) -> str:
    """A value as a user types it in a study file or on the command line: ``null``,
    ``true``/``false``, ``0.002``."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def allowed_values(field: FieldInfo) -> str:
    """What a field admits, read from its type: ``mae | ae | dae``, ``number in (0, 1)``,
    ``integer ≥ 1 | null``, ``auto | true | false``."""
    words: list[str] = []
    if _registry_of(field) is not None and typing.get_origin(field.annotation) is tuple:  # eval.evaluators
        return "a list of " + ", ".join(listable_evaluators())
    if _registry_of(field) is not None:  # a registry's names: built-in, then any plugin's
        words += list(_choices(field).names())
    for member in _union_members(field.annotation):
        if typing.get_origin(member) is Literal:
            words += [as_typed(choice) for choice in typing.get_args(member)]
        elif member is bool:
            words += ["true", "false"]
        elif typing.get_origin(member) is Annotated:  # a bounded member of a union: int ≥ 0 | all
            kind, *constraints = typing.get_args(member)
            words.append(_bounded(_KIND_WORDS.get(kind, getattr(kind, "__name__", str(kind))), constraints))
        elif member is not type(None) and not (member is str and _registry_of(field)):
            words.append(_bounded(_KIND_WORDS.get(member, getattr(member, "__name__", str(member))), field.metadata))
    if type(None) in _union_members(field.annotation):
        words.append(NULL)
    return " | ".join(words)


def declared_choices(key: str) -> list:
    """A choice key's values in their declared order: its registry's names (built-ins first, then
    a plugin's) or its ``Literal``'s; [] for a key that is no choice (or no key)."""
    field = Config.model_fields.get(key)
    if field is None:
        return []
    if _registry_of(field) is not None:
        return list(_choices(field).names())
    literal = next((m for m in _union_members(field.annotation) if typing.get_origin(m) is Literal), None)
    return list(typing.get_args(literal)) if literal is not None else []


def _objectives(**answers: bool | None) -> str:
    """The registered objectives with these answers (``masked=True``): ``mae``, or ``mae | mine``."""
    return " | ".join(name for name in registry.objectives.names()
                      if all(getattr(registry.objectives.get(name), key) == value for key, value in answers.items()))


def _registry_of(field: FieldInfo) -> str | None:
    extra = field.json_schema_extra
    return extra.get("registry") if isinstance(extra, dict) else None


def _choices(field: FieldInfo) -> registry.Registry:
    """The registry whose names a choice field takes (its ``json_schema_extra["registry"]``)."""
    return getattr(registry, _registry_of(field))


def _union_members(annotation: Any) -> tuple[Any, ...]:
    """``int | None`` -> (int, NoneType); any other annotation -> (annotation,)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _bounded(kind: str, constraints: list[Any]) -> str:
    """``integer ≥ 1``, ``number > 0``, ``number in [0, 1)``: a field's ge/gt/le/lt constraints."""
    lower = upper = None
    for constraint in constraints:
        for name, words in (("ge", ("[", "≥")), ("gt", ("(", ">"))):
            if getattr(constraint, name, None) is not None:
                lower = (getattr(constraint, name), *words)
        for name, words in (("le", ("]", "≤")), ("lt", (")", "<"))):
            if getattr(constraint, name, None) is not None:
                upper = (getattr(constraint, name), *words)
    if lower and upper:
        return f"{kind} in {lower[1]}{lower[0]:g}, {upper[0]:g}{upper[1]}"
    if lower:
        return f"{kind} {lower[2]} {lower[0]:g}"
    if upper:
        return f"{kind} {upper[2]} {upper[0]:g}"
    return kind
