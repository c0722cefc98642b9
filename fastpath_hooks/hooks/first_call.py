"""The first call of a kernel whose check waits for it (engine/first_call.py): right after `import <kernel>`, its
checked functions are held (every binding of them in the kernel's modules), so that transformers' decorator (5.15+)
binds the held function; its first call gives the call's shapes, dtype, length and variant to the check and waits
for the verdict. A pass lets every call through to the kernel and puts the kernel's function back in transformers'
choice; a failure sends this call and every later one to transformers' torch path (its decorated function's own
`torch_function`) - a caller outside transformers gets the reason as a RuntimeError.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading

from ..engine.first_call import config_facts
from .closures import closure_of, decorated_function, set_choice

_PASS, _FAIL = "pass", "fail"


class Held:
    """A kernel function whose first call waits for the kernel's check."""

    def __init__(self, real, pending, name: str):
        functools.update_wrapper(self, real)   # transformers reads the signature (through __wrapped__)
        self._real, self._pending, self._name = real, pending, name
        self._state, self._why, self._lock = None, "", threading.Lock()

    def __call__(self, *args, **kwargs):
        if self._state is _PASS:
            return self._real(*args, **kwargs)
        if self._state is None:
            with self._lock:   # one waits for the verdict; the others (threads) after it
                if self._state is None:
                    ok, why = self._pending.verdict(call_facts(args, kwargs))
                    self._state, self._why = (_PASS if ok else _FAIL), why
                    if not ok:   # blocked from now on in this process: a fresh import fails, the late pass agrees
                        from .. import engine

                        engine.settle(self._pending.kernel, why, numeric=self._pending.numeric)
                    release(self._pending, self._state is _PASS)
        if self._state is _PASS:
            return self._real(*args, **kwargs)
        return _torch_path(self._name, self._why, sys._getframe(1), args, kwargs)

    def __get__(self, obj, objtype=None):   # a function stays a function where it is a class attribute
        return self if obj is None else functools.partial(self, obj)


def hold(pending) -> None:
    """Hold the kernel's checked functions (`module:attribute`) wherever its modules bind them, and start the check
    at the shapes the decision knows (while the model is built: the first call waits only for what is left)."""
    for item in pending.functions:
        modname, _, attr = item.partition(":")
        try:   # the kernel has just been imported: its module of the function, as transformers imports it next
            module = importlib.import_module(modname)
        except Exception:   # not there: nothing to hold (the call takes what transformers finds)
            continue
        real = getattr(module, attr, None)
        if real is None or isinstance(real, Held):
            continue
        held = Held(real, pending, attr)
        top = modname.split(".")[0]
        for name, mod in list(sys.modules.items()):
            if mod is None or not (name == top or name.startswith(top + ".")):
                continue
            namespace = getattr(mod, "__dict__", {})
            for key, value in list(namespace.items()):
                if value is real:
                    namespace[key] = held
    payload = pending.payload
    pending.start(config_facts(payload.get("config") or {}, payload.get("repeat", False), sys._getframe(1)))


def release(pending, passed: bool) -> None:
    """After the verdict: the kernel's modules bind the real function again, and transformers' decorated functions
    that chose a held one choose again - the kernel's function, or (failed) their torch path."""
    tops = tuple({item.split(".")[0].split(":")[0] for item in pending.functions})
    for name, mod in list(sys.modules.items()):
        namespace = getattr(mod, "__dict__", None)
        if not namespace:
            continue
        if name.startswith("transformers.models."):
            _rechoose(namespace, passed)
        elif name in tops or name.startswith(tuple(t + "." for t in tops)):
            for key, value in list(namespace.items()):
                if isinstance(value, Held) and value._pending is pending:
                    namespace[key] = value._real


def _rechoose(namespace: dict, passed: bool) -> None:
    from .._names import DECORATED

    for name in DECORATED:
        if name not in namespace:
            continue
        function = decorated_function(namespace[name])
        closure = closure_of(function) or {}
        held = closure.get("implementation")
        if not isinstance(held, Held):
            continue
        chosen = held._real if passed else closure.get("torch_function")
        if chosen is None:
            continue
        set_choice(function, held, {"implementation": chosen, "is_new_implementation": passed,
                                    "applicable_params": tuple(inspect.signature(chosen).parameters)})


def call_facts(args, kwargs) -> dict:
    """What the check needs of a gated-delta-rule call: (key heads, value heads, K, V), dtype, length, variant."""
    q = kwargs.get("q", args[0] if len(args) > 0 else None)
    k = kwargs.get("k", args[1] if len(args) > 1 else None)
    v = kwargs.get("v", args[2] if len(args) > 2 else None)
    facts: dict = {}
    try:
        facts["shapes"] = [[int(k.shape[2]), int(v.shape[2]), int(k.shape[3]), int(v.shape[3])]]
        facts["dtype"] = str(q.dtype).replace("torch.", "")
        facts["tune_seq"] = int(q.shape[1])
    except (AttributeError, IndexError, TypeError):
        return {}
    facts["final_state"] = bool(kwargs.get("output_final_state", False))
    facts["varlen"] = kwargs.get("cu_seqlens") is not None
    return facts


def _torch_path(name: str, why: str, caller, args, kwargs):
    """The call on transformers' torch path: its decorated function's `torch_function` (a free variable of the
    frame that called the kernel), the keywords it takes; packed rows it cannot keep apart are refused."""
    torch_function = caller.f_locals.get("torch_function") if caller is not None else None
    if torch_function is None:
        raise RuntimeError(f"fastpath-hooks: {name} is blocked here: {why}")
    params = inspect.signature(torch_function).parameters
    if kwargs.get("cu_seqlens") is not None and "cu_seqlens" not in params and not any(
            p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"{name} is blocked here ({why}) and transformers' torch path cannot keep packed "
                         "sequences apart: train without packing, or fix the kernel")
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return torch_function(*args, **kwargs)
