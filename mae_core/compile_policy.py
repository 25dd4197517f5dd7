"""``compile=auto``'s decision from measurement (issue 36): compile a run when what compilation
saves over its updates exceeds what it costs,

    updates × gain > compile cost,

``gain`` the seconds each update saves once compiled (eager minus compiled, in the same update
mode: both in a CUDA graph where the update is captured) and ``compile cost`` the extra seconds of
the first update (the compilation). Both depend on the device and on the model: the recorded
measurements are in :data:`RECORDED`, one place, keyed by (device type, model class, captured in
a CUDA graph). ``python -m benchmarks.bench_cuda`` measures both for the digits model and for
ViT-B/16 (parts ``compile_cost`` and ``ours_eager``/``ours_compiled``) and writes them, with
the decision this rule makes from them, into its JSON: a measurement enters :data:`RECORDED` from
there, with its source.

Where nothing is recorded the decision falls back to a fixed run length per device class
(:data:`FALLBACK_MIN_UPDATES`): 20,000 updates on the CPU (the digits model's measured cold
compile, docs/performance.md) and 1,750 on CUDA (issue 26's figure for ViT-B/16 on an H200,
not measured in this repository). One exception, the issue's own rule: a small model whose update
is captured in a CUDA graph is not compiled without a measurement that says it pays, since the
graph already removes the launch overhead that compiling a small model mostly saves, and the
compilation is the largest fixed cost of a short run.

Nothing here imports torch: ``mae-study config`` resolves ``compile_enabled`` without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Below this encoder width a model is "small" (the digits default is 64; ViT-S 384, ViT-B 768).
SMALL_ENCODER_WIDTH = 256
# The fallback: compile=auto compiles runs of at least this many updates where nothing is recorded.
FALLBACK_MIN_UPDATES = {"cpu": 20_000, "cuda": 1_750}


@dataclass(frozen=True)
class CompileCost:
    """What compiling a model costs and saves on a device: ``compile_s`` seconds once (the first
    update's time minus an eager update's), ``gain_s`` seconds on every later update."""

    compile_s: float
    gain_s: float
    source: str = ""  # where and how it was measured (a bench JSON, a date, a machine)

    @property
    def break_even(self) -> float:
        """The update count from which compiling pays (infinite when it saves nothing)."""
        return self.compile_s / self.gain_s if self.gain_s > 0 else math.inf

    def pays_off(self, updates: int) -> bool:
        return compile_pays(self.compile_s, self.gain_s, updates)


def compile_pays(compile_s: float, gain_s: float, updates: int) -> bool:
    """``updates × gain_s > compile_s``: the saving over the run exceeds the compilation."""
    return updates * gain_s > compile_s


def model_class(encoder_width: int) -> str:
    """``small`` (encoder width up to :data:`SMALL_ENCODER_WIDTH`) or ``large``."""
    return "small" if encoder_width <= SMALL_ENCODER_WIDTH else "large"


# The measurements compile=auto decides from: (device type, model class, update in a CUDA graph)
# -> CompileCost. None is recorded yet: no GPU run of the bench's compile_cost part has been made
# (issue 36's run predates it), so every decision is the fallback's until one is.
RECORDED: dict[tuple[str, str, bool], CompileCost] = {}


def fallback_compiles(device_type: str, updates: int) -> bool:
    """The fallback rule (no measurement recorded): compile a run of ``updates`` once it reaches
    :data:`FALLBACK_MIN_UPDATES` of its device class (any device other than CUDA: the CPU's)."""
    return updates >= FALLBACK_MIN_UPDATES["cuda" if device_type == "cuda" else "cpu"]


@dataclass(frozen=True)
class CompileDecision:
    compile: bool
    reason: str


def decide(device_type: str, updates: int, *, encoder_width: int, graph: bool,
           recorded: dict[tuple[str, str, bool], CompileCost] | None = None) -> CompileDecision:
    """Whether ``compile=auto`` compiles a run of ``updates`` on ``device_type`` (any device
    other than CUDA decides as the CPU) of a model ``encoder_width`` wide whose update is
    (``graph``) or is not captured in a CUDA graph, and why; ``recorded`` defaults to
    :data:`RECORDED`."""
    device = "cuda" if device_type == "cuda" else "cpu"
    size = model_class(encoder_width)
    key = (device, size, graph and device == "cuda")
    cost = (RECORDED if recorded is None else recorded).get(key)
    if cost is not None:
        verb = "pays" if cost.pays_off(updates) else "does not pay"
        return CompileDecision(cost.pays_off(updates), (
            f"{updates} updates × {cost.gain_s * 1e3:.3g} ms saved {verb} for a {cost.compile_s:.3g} s compile "
            f"(break-even {cost.break_even:.0f} updates; {device}, {size} model; {cost.source})"))
    if key == ("cuda", "small", True):
        return CompileDecision(False, "a small model's update captured in a CUDA graph: no measurement says "
                                      "compiling it pays, so the graph runs uncompiled")
    threshold = FALLBACK_MIN_UPDATES[device]
    return CompileDecision(fallback_compiles(device, updates), f"no measurement recorded for a {size} model on {device}: "
                                                 f"the fallback compiles runs of {threshold} updates or more")
