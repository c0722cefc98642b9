"""fastpath-hooks: make transformers' fast kernel paths (fla, causal-conv1d, mamba-ssm, tilelang) just work.

    import fastpath_hooks
    fastpath_hooks.install()

Importing this package is nearly free (it runs at interpreter start when enabled):
everything heavy loads the first time transformers or a kernel import needs it.
"""

__all__ = ["attention", "install", "uninstall", "__version__"]


def __getattr__(name):
    # `import fastpath_hooks` loads nothing else: the version lives in the leaf, read when asked for
    if name == "__version__":
        from ._names import VERSION

        return VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install(*, kernels=None, on_event=None):
    """Hook transformers' kernel choice; see `fastpath_hooks.hooks.install`."""
    from .hooks import install as _install

    return _install(kernels=kernels, on_event=on_event)


def uninstall():
    """Restore every gate and remove the import hook; see `fastpath_hooks.hooks.uninstall`."""
    from .hooks import uninstall as _uninstall

    _uninstall()


def attention(requested=None):
    """What `attn_implementation` should be here: a `str` with `.implementation` and `.reason` - FA3 on Hopper or
    FA2 on Ampere / Ada where fastpath-hooks can have it, else "sdpa"; `requested` (a choice already made) is
    returned as it is. `AutoModelForCausalLM.from_pretrained(path, attn_implementation=fastpath_hooks.attention())`.
    See `fastpath_hooks.engine.attention`."""
    from .engine.attention import choose

    return choose(requested)
