"""What `attn_implementation` should be on this machine (`fastpath_hooks.attention()`): the flash attention the
pins prefer on these GPUs (`attention_gpus`: FA3 on Hopper, FA2 on Ampere / Ada) where the plan can have it
(installed, or installable within FASTPATH_HOOKS_TIMEOUT), else `sdpa`; a choice the caller made is kept as is.
Decided from the same probe and policy as everything else, reading nothing that `import fastpath_hooks` loads."""

from __future__ import annotations

from ..decide.common import USABLE, no_accelerator_reason
from .context import complete, load_context
from .world import World

KEPT = ("auto", None)   # what asks for a choice; anything else is the caller's own and kept


class Attention(str):
    """An attention implementation: a `str` (pass it as `attn_implementation=`) with `.implementation` (the same
    text) and `.reason` (why, in one sentence). Immutable; equal to its text."""

    def __new__(cls, implementation: str, reason: str):
        self = super().__new__(cls, implementation)
        object.__setattr__(self, "reason", reason)
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    @property
    def implementation(self) -> str:
        return str.__str__(self)

    def __str__(self) -> str:
        return self.implementation

    def __repr__(self) -> str:
        return f"Attention({self.implementation!r}, reason={self.reason!r})"

    def __reduce__(self):
        return type(self), (self.implementation, self.reason)


def choose(requested: str | None = None) -> Attention:
    """`requested` (the caller's own choice, kept), or the best flash attention here, or sdpa; never raises for a
    machine fastpath-hooks cannot read (sdpa with why)."""
    if requested not in KEPT:
        if not isinstance(requested, str):
            raise TypeError(f"attention() takes an attn_implementation name or None, not {type(requested).__name__}")
        return Attention(requested, f"{requested} is the caller's own choice: kept as given")
    settings, pins = load_context()
    world = World()
    env = world.probe(settings, pins)
    if env.accelerator is None:
        return Attention("sdpa", no_accelerator_reason(env))
    if env.accelerator != "cuda":
        return Attention("sdpa", f"flash attention is managed on CUDA GPUs only; this is {env.accelerator.upper()}")
    gpus = "+".join(env.gpus) or "no GPU listed"
    kernels = sorted((k for k, s in pins.kernels.items() if s.attn_implementation and s.attention_gpus),
                     key=lambda k: pins.kernel(k).attn_implementation, reverse=True)   # flash_attention_3 first
    preferred = [k for k in kernels if env.gpus and all(g in pins.kernel(k).attention_gpus for g in env.gpus)]
    if not preferred:
        where = "; ".join(f"{pins.kernel(k).attn_implementation} on {'/'.join(pins.kernel(k).attention_gpus)}"
                          for k in kernels)
        return Attention("sdpa", f"{gpus}: no flash attention is preferred on it ({where}); sdpa is torch's own")
    env, plan = complete(env, world.decide(env, settings, pins), settings, pins)
    why = []
    for kernel in preferred:
        decision = plan[kernel]
        name = pins.kernel(kernel).attn_implementation
        said = decision.short_reason or decision.reason
        if decision.action in USABLE:
            return Attention(name, f"{gpus}: {kernel} {'is installed' if decision.action == 'ok' else 'can be had'}"
                                   f" ({said})")
        why.append(f"{kernel} cannot be had here: {said}")
    return Attention("sdpa", f"{gpus}: " + "; ".join(why))
