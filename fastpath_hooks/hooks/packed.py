"""Packed rows that leak, said at the first forward that could leak; nothing is changed.

transformers keeps documents packed in one row (restarting `position_ids`) apart under sdpa, eager and
flex_attention only when a forward has no attention mask and no cache: masking_utils' `_preprocess_mask_arguments`
then calls `find_packed_sequence_indices` and builds a block-causal mask (4.57 - 5.25). With an attention mask
(all ones too) or a cache (`use_cache` left at the config's default outside Trainer) the documents attend to
each other, silently (transformers#46093, trl#3910).

`patch(masking_utils)` wraps `_preprocess_mask_arguments`. Every mask transformers makes goes through that
module global, so models built before install() are seen too, and the wrapper sees what transformers sees:
the positions it gets (a model's text positions), the mask, the cache, the attention implementation. One
look per process: the first mask of two positions or more that could leak (sdpa, eager or flex_attention
with a 2-D mask or a cache) has its positions read - one device sync - and the look is over; a mask that
cannot leak ends it too when it is a training forward's (grad enabled). Then the original is back: nothing
more is looked at. Under torch.compile and tracing nothing is looked at.
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch   # loaded with masking_utils, which imports it

from .._names import MASKED_ATTENTION, MASKS_MODULE

TARGET = "_preprocess_mask_arguments"
ORIGINAL = "_fastpath_hooks_original"
FLASH = "flash_attention_2"   # keeps packed documents apart from position_ids (one row) or cu_seq_lens
CACHES = ("cache", "past_key_values")   # 5.25 / 4.57 - 5.24


_final = False   # a look was final in this process: install() again does not look again (uninstall() forgets it)


def patch(module) -> None:
    """Wrap `module._preprocess_mask_arguments` (called with the hooks' lock held); a layout this does not
    know stays as it is (the debug log says so)."""
    original = module.__dict__.get(TARGET)
    if _final or original is None or hasattr(original, ORIGINAL):
        return
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        names = []
    cache = next((name for name in CACHES if name in names), None)
    if cache is None or not {"config", "attention_mask", "position_ids"} <= set(names):
        from ..events import debug

        debug(f"transformers.masking_utils.{TARGET} takes {names}: packed rows are not looked at")
        return
    places = {"config": "config", "embeds": names[1], "attention_mask": "attention_mask", "cache": cache,
              "position_ids": "position_ids"}
    look = _Look({key: (name, names.index(name)) for key, name in places.items()})

    @functools.wraps(original)
    def _preprocess_mask_arguments(*args, **kwargs):
        if look.open:
            look(args, kwargs)
            if not look.open and module.__dict__.get(TARGET) is _preprocess_mask_arguments:
                module.__dict__[TARGET] = original    # final: nothing more is looked at
        return original(*args, **kwargs)

    _preprocess_mask_arguments._fastpath_hooks_original = original
    module.__dict__[TARGET] = _preprocess_mask_arguments


def unpatch() -> None:
    """The original back (uninstall(); a later install() looks again)."""
    global _final
    _final = False
    module = sys.modules.get(MASKS_MODULE)
    wrapper = getattr(module, "__dict__", {}).get(TARGET)
    original = getattr(wrapper, ORIGINAL, None)
    if original is not None:
        module.__dict__[TARGET] = original


class _Look:
    """Where the wrapped function takes what is looked at; `open` until a look is final."""

    def __init__(self, places: dict):
        self.places = places   # key -> (parameter name, position)
        self.open = True

    def arg(self, args, kwargs, key):
        name, index = self.places[key]
        return kwargs[name] if name in kwargs else args[index] if index < len(args) else None

    def __call__(self, args, kwargs) -> None:
        global _final
        try:
            if torch.compiler.is_compiling() or torch.jit.is_tracing():
                return   # a traced graph must not read a tensor's values (a graph break, an export failure)
            final = self.look(args, kwargs)
        except Exception as exc:   # never make a forward worse than without fastpath-hooks
            from ..events import internal_error

            internal_error(exc)
            final = True
        if final:
            self.open, _final = False, True

    def look(self, args, kwargs) -> bool:
        """Whether this look is final: positions that could leak read (a leak said), or a training forward's."""
        position_ids = self.arg(args, kwargs, "position_ids")
        if not isinstance(position_ids, torch.Tensor) or position_ids.ndim == 0 or position_ids.shape[-1] < 2:
            return False   # no positions (transformers finds no packing either), or a decoding step
        config, mask = self.arg(args, kwargs, "config"), self.arg(args, kwargs, "attention_mask")
        cache = self.arg(args, kwargs, "cache")
        attention = getattr(config, "_attn_implementation", None)
        flat = isinstance(mask, torch.Tensor) and mask.ndim == 2   # a 4-D or block mask is the caller's own
        if attention in MASKED_ATTENTION and (flat or (mask is None and cache is not None)):
            ids = position_ids.reshape(-1, position_ids.shape[-1])
            starts, padded = _restarts(ids, mask if flat else None)
            if starts:
                embeds = self.arg(args, kwargs, "embeds")
                rows = embeds.shape[0] if isinstance(embeds, torch.Tensor) and embeds.ndim == 3 else ids.shape[0]
                _say(config, attention, flat, cache is not None, starts, rows=rows, padded=padded)
            return True
        return torch.is_grad_enabled()


def _restarts(ids, mask) -> tuple:
    """(document starts after a row's first token, whether the mask hides a token) for positions `ids`
    (rows x positions): a position that does not follow its neighbour by one starts a document (transformers'
    rule), counted between tokens the mask keeps (left padding's positions start none). One device sync."""
    new = ids[:, 1:] - ids[:, :-1] != 1
    hidden = torch.zeros((), dtype=torch.long, device=ids.device)
    length, rows = ids.shape[-1], (ids.shape[0], mask.shape[0] if mask is not None else 1)
    if mask is not None and mask.shape[-1] >= length and (rows[0] == rows[1] or 1 in rows):
        kept = mask[:, -length:].to(device=ids.device, dtype=torch.bool)   # a cache's past columns come first
        new = new & kept[:, 1:] & kept[:, :-1]
        hidden = (~kept).sum()
    starts, hidden = torch.stack([new.sum(), hidden]).tolist()
    return int(starts), bool(hidden)


def _say(config, attention: str, mask: bool, cache: bool, starts: int, *, rows: int, padded: bool) -> None:
    """One line, once per process: the rule's (decide/messages.py); its whole text in the event's detail."""
    from .. import events
    from ..decide.messages import FORWARD, PACKED_LEAK, forward_line

    remedy = " and ".join(x for x, given in (("attention_mask=None", mask), ("use_cache=False", cache)) if given)
    # flash attention keeps packed documents apart from position_ids in one row without a padding mask
    values = {"attention": attention, "remedy": remedy, "flash": FLASH if rows == 1 and not padded else ""}
    model = str(getattr(config, "model_type", "") or type(config).__name__)
    given = " and ".join(x for x, g in (("an attention mask", mask), ("a cache", cache)) if g)
    version = getattr(sys.modules.get("transformers"), "__version__", "?")
    detail = (f"{model}: {starts} document(s) starting inside {rows} packed row(s) attend to the ones before them "
              f"under {attention} with {given}: transformers {version} keeps packed documents apart only with no "
              f"attention mask and no cache (masking_utils) - {forward_line(PACKED_LEAK, values)}")
    events.emit(FORWARD[PACKED_LEAK].severity, forward_line(PACKED_LEAK, values, subject=model), None,
                once=PACKED_LEAK, detail=detail, rule=PACKED_LEAK, model=model, attention=attention)
