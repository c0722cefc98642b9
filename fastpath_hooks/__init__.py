"""fastpath-hooks: make transformers' fast kernel paths (fla, causal-conv1d, mamba-ssm, tilelang) just work.

    import fastpath_hooks
    fastpath_hooks.install()

Importing this package is nearly free (it runs at interpreter start when enabled): `install` and `uninstall`
(fastpath_hooks.hooks) and `__version__` load the first time they are asked for.
"""

__all__ = ["install", "uninstall", "__version__"]


def __getattr__(name):
    if name == "__version__":
        from ._names import VERSION

        return VERSION
    if name in ("install", "uninstall"):
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
