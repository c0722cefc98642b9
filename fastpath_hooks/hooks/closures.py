"""transformers' decorated kernel functions (5.15+): the choice their decorator made lives in the closure of the
function it returns (`implementation`, `torch_function` ...); reading it and writing a new one in place (the late
pass, hooks/first_call.py) keeps the function objects, which HF `kernels` routes by identity.
"""

from __future__ import annotations


# What transformers' decorator computes from its choice (5.17 - 5.25): the closure names a fresh decoration
# rewrites in the existing function (those one version lacks are skipped).
CHOICE = ("implementation", "applicable_params", "is_new_implementation", "supported_devices")


def decorated_function(value):
    """The function transformers' decorator made: the module global itself, or under HF `kernels` the
    function its `Func` module calls (`type(value).forward`'s free variable `func`)."""
    if getattr(value, "__code__", None) is not None:
        return value
    forward = getattr(type(value), "forward", None)
    return (closure_of(forward) or {}).get("func")


def set_choice(function, old, fresh: dict) -> bool:
    """Write the fresh choice into `function`'s cells - if its implementation is still `old`."""
    closure = closure_of(function) or {}
    if "implementation" not in closure or closure["implementation"] is not old:
        return False
    cells = dict(zip(function.__code__.co_freevars, function.__closure__))
    for name in CHOICE:
        if name in cells and name in fresh:
            cells[name].cell_contents = fresh[name]
    return True


def closure_of(function) -> dict | None:
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells:
        return None
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out
