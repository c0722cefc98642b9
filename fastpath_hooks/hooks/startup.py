# Written by `fastpath-hooks enable`; `fastpath-hooks disable` removes it. FASTPATH_HOOKS_DISABLE=1 skips it.
# The start-up stand-in (format 5), as the module `_fastpath_hooks_startup` (pth) or a block in sitecustomize.py.
# It leaves no name behind; a function, not a class (a class costs ~65 K instructions more at every start). At
# its first watched import it turns inert and hands over to `fastpath_hooks.hooks.resume`; it never leaves
# sys.meta_path (CPython iterates that list while it calls us).
try:
    import os as _fph_os
    if _fph_os.environ.get("FASTPATH_HOOKS_DISABLE", "").strip().lower() not in ('1', 'true', 'yes', 'on'):
        import sys as _fph_sys

        def _fph_stand_in(watched):
            def _FastpathHooksStartup(fullname, path=None, target=None):
                """Stands in for fastpath-hooks' import finder until a watched module is imported."""
                if fullname not in _FastpathHooksStartup.watched:
                    return None
                _FastpathHooksStartup.watched = ()  # once: from now on the real finder (or nothing) answers
                try:
                    from fastpath_hooks.hooks import resume

                    return resume(fullname, path, target, format=5)
                except Exception:  # the package was removed or is broken: step aside
                    return None

            _FastpathHooksStartup.watched = watched
            _FastpathHooksStartup.find_spec = _FastpathHooksStartup
            return _FastpathHooksStartup

        _fph_sys.meta_path.insert(0, _fph_stand_in(frozenset(
            ('causal_conv1d', 'fla', 'flash_attn', 'flash_attn_3', 'flash_attn_interface', 'flash_qla', 'mamba_ssm', 'tilelang', 'transformers.integrations.hub_kernels', 'transformers.masking_utils', 'transformers.utils.import_utils'))))  # _names.WATCHED
        del _fph_sys, _fph_stand_in
    del _fph_os
except Exception:
    pass
