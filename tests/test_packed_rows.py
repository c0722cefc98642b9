"""Packed rows that leak are said (issue 41): documents packed in one row (restarting position_ids) attend to
each other under sdpa / eager when the forward has an attention mask or a cache; one line at the first forward
that does it, naming the fix; nothing is changed.

Real tiny Llama models from a config on this CPU, real transformers (this environment's; one slow test also
4.57.6 in a real venv, where masking_utils takes `past_key_values` and `cache_position`), the real hook path:
install() with masking_utils imported, and (the slow test) masking_utils imported after install().
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import fastpath_hooks
from fastpath_hooks import events
from fastpath_hooks.decide import messages
from fastpath_hooks.events import PREFIX
from support import venvs

from transformers import LlamaConfig, LlamaForCausalLM
import transformers.masking_utils as masking_utils

ORIGINAL = masking_utils._preprocess_mask_arguments
FIRST, SECOND = 6, 5   # the two documents' lengths
LINE = ('llama: packed documents attend to each other under sdpa (attention_mask=None, '
        'or attn_implementation="flash_attention_2")')


def tiny(attention: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation=attention)
    return LlamaForCausalLM(config)


def documents():
    """(the packed row's input_ids, its restarting position_ids, the second document alone)."""
    generator = torch.Generator().manual_seed(1)
    first, second = (torch.randint(0, 64, (1, n), generator=generator) for n in (FIRST, SECOND))
    positions = torch.cat([torch.arange(FIRST), torch.arange(SECOND)])[None]
    return torch.cat([first, second], dim=1), positions, second


@pytest.fixture
def hooked(monkeypatch, tmp_path):
    """install() in this process, which speaks; the events heard; uninstall() after."""
    for name in list(os.environ):
        if name.startswith(("FASTPATH_HOOKS_", "_FASTPATH_HOOKS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("_FASTPATH_HOOKS_VOICE", "")
    fastpath_hooks.uninstall()
    heard: list = []
    assert fastpath_hooks.install(on_event=heard.append) is True
    yield heard
    fastpath_hooks.uninstall()
    events.forget()


def said(heard) -> list:
    return [e for e in heard if e.get("rule") == messages.PACKED_LEAK]


def looking() -> bool:
    return masking_utils._preprocess_mask_arguments is not ORIGINAL


# -- the leak the line warns about is real -------------------------------------------------------

@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_documents_attend_to_each_other_with_a_mask_or_a_cache_and_not_without(attention):
    """transformers alone (no fastpath-hooks): the second document's logits and loss in the packed row equal
    its own run without a mask and a cache, and differ with an all-ones mask, or with use_cache left at the
    config's default (a DynamicCache)."""
    fastpath_hooks.uninstall()
    model = tiny(attention)
    ids, positions, second = documents()
    with torch.no_grad():
        alone = model(input_ids=second, use_cache=False).logits[0]
        loss_alone = model(input_ids=second, labels=second, use_cache=False).loss

        def packed(**kwargs):
            out = model(input_ids=ids, position_ids=positions, labels=ids, **kwargs)
            logits = out.logits[0, FIRST:]
            # the second document's own next-token loss, from its own logits in the packed row
            loss = torch.nn.functional.cross_entropy(logits[:-1], second[0, 1:])
            return (logits - alone).abs().max().item(), abs(loss.item() - loss_alone.item())

        apart = packed(use_cache=False)
        ones = packed(attention_mask=torch.ones_like(ids), use_cache=False)
        cache = packed()
    assert model.config.use_cache is True
    assert apart[0] < 1e-5 and apart[1] < 1e-5, apart
    assert ones[0] > 1e-2 and ones[1] > 1e-3, ones
    assert cache[0] > 1e-2 and cache[1] > 1e-3, cache


# -- said once, with the fix, only where it leaks --------------------------------------------------

CASES = [   # (id, packed, attention_mask, use_cache, the remedy the line names or None)
    ("all-ones mask", True, "ones", False, "attention_mask=None"),
    ("cache (the config's default)", True, None, None, "use_cache=False"),
    ("mask and cache", True, "ones", None, "attention_mask=None and use_cache=False"),
    ("no mask, no cache", True, None, False, None),
    ("unpacked, mask and cache", False, "ones", None, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_first_training_forward_says_a_leak_once_and_then_nothing_is_looked_at(hooked, case, capsys):
    _, packed, mask, use_cache, remedy = case
    model = tiny()
    ids, positions, _ = documents()
    kwargs = {"input_ids": ids, "labels": ids}
    if packed:
        kwargs["position_ids"] = positions
    if mask == "ones":
        kwargs["attention_mask"] = torch.ones_like(ids)
    if use_cache is not None:
        kwargs["use_cache"] = use_cache
    assert looking()
    model(**kwargs).loss.backward()
    assert not looking()            # the first training forward was final: the original is back
    model(**kwargs)
    lines = [line for line in capsys.readouterr().err.splitlines() if "packed documents" in line]
    if remedy is None:
        assert said(hooked) == [] and lines == []
        return
    (event,) = said(hooked)
    assert event["type"] == "warning" and event["model"] == "llama" and event["attention"] == "sdpa"
    line = (f'llama: packed documents attend to each other under sdpa ({remedy}, '
            'or attn_implementation="flash_attention_2")')
    assert event["message"] == line and lines == [PREFIX + line]
    assert "keeps packed documents apart only with no attention mask and no cache" in event["detail"]


def test_a_qwen3_5_with_use_cache_left_at_its_default_is_said_and_not_with_use_cache_false(hooked):
    """Qwen3.5 (transformers#46093): outside Trainer its forward makes a DynamicCache (config use_cache=True), so
    its full-attention layers see no document boundary; with use_cache=False transformers finds them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3_5_text", vocab_size=64, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    model = AutoModelForCausalLM.from_config(config)
    ids, positions, _ = documents()
    model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss.backward()
    assert said(hooked) == [] and not looking()
    fastpath_hooks.uninstall()
    assert fastpath_hooks.install(on_event=hooked.append) is True
    model(input_ids=ids, position_ids=positions, labels=ids).loss.backward()
    assert [e["message"] for e in said(hooked)] == [
        'qwen3_5_text: packed documents attend to each other under sdpa (use_cache=False, '
        'or attn_implementation="flash_attention_2")']


def test_the_exact_line_for_an_all_ones_mask(hooked, capsys):
    model = tiny()
    ids, positions, _ = documents()
    model(input_ids=ids, position_ids=positions, attention_mask=torch.ones_like(ids), use_cache=False)
    assert capsys.readouterr().err.splitlines()[-1] == PREFIX + LINE


def test_more_rows_or_padding_are_not_told_flash_attention(hooked):
    """flash attention keeps packed documents apart from position_ids only in one row without a padding mask:
    with two rows (or padding) the line names only the mask."""
    model = tiny()
    ids, positions, _ = documents()
    ids, positions = ids.repeat(2, 1), positions.repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, -1] = 0
    model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False)
    (event,) = said(hooked)
    assert event["message"] == "llama: packed documents attend to each other under sdpa (attention_mask=None)"


def test_a_left_padded_generation_is_not_packed_and_is_the_one_look(hooked):
    """generate() (no grad) on a left-padded batch: its pads' positions (0, 0, 0, 1, 2 in 5.25) start no document and
    nothing is said. Its prefill could leak (a mask and a cache), so its positions were read: the look is over
    - a packed training forward after it is not looked at (the price of one look per process)."""
    model = tiny()
    prompt = torch.randint(0, 64, (2, 5))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    assert looking()
    with torch.no_grad():
        model(input_ids=prompt, use_cache=False)      # no mask, no cache, no grad: transformers keeps rows apart
        assert looking()
        model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert said(hooked) == [] and not looking()


@pytest.mark.parametrize("attention, mask", [("flash_attention_2", "ones"), ("sdpa", "4d")])
def test_flash_attention_or_a_mask_of_ones_own_is_left_alone(hooked, attention, mask):
    """The mask functions the models call, with what a model passes them: under flash attention (it drops an
    all-ones mask and reads position_ids) and with a 4-D mask of the caller's own, nothing is said; a
    training mask was looked at, so the look is over."""
    config = tiny().config
    config._attn_implementation = attention
    assert looking()
    ids, positions, _ = documents()
    embeds = torch.zeros(1, ids.shape[1], config.hidden_size, requires_grad=True)
    given = torch.ones_like(ids) if mask == "ones" else torch.zeros(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
    masking_utils.create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=given, cache=None,
                                     position_ids=positions)
    assert said(hooked) == [] and not looking()


def test_uninstall_puts_the_original_back_and_install_looks_again(hooked):
    assert looking()
    fastpath_hooks.uninstall()
    assert not looking()
    assert fastpath_hooks.install() is True and looking()


# -- in a real venv: masking_utils imported after install(), and transformers 4.57.6 ----------------

CHILD = r'''
import json, os, sys, torch
import fastpath_hooks
heard = []
assert fastpath_hooks.install(on_event=heard.append) is True
from transformers import LlamaConfig, LlamaForCausalLM   # masking_utils is imported now, after install()
import transformers, transformers.masking_utils as mu
out = {"version": transformers.__version__,
       "wrapped": hasattr(mu._preprocess_mask_arguments, "_fastpath_hooks_original")}
torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, attn_implementation="sdpa")
model = LlamaForCausalLM(config)
ids = torch.randint(0, 64, (1, 11))
positions = torch.cat([torch.arange(6), torch.arange(5)])[None]
cases = {"ones": dict(position_ids=positions, attention_mask=torch.ones_like(ids), use_cache=False),
         "nothing": dict(position_ids=positions, use_cache=False),
         "cache": dict(position_ids=positions),
         "unpacked": dict(attention_mask=torch.ones_like(ids))}
for name, kwargs in cases.items():
    if name != "ones":    # each case a fresh look (the first one's through the finder)
        fastpath_hooks.uninstall(); heard.clear(); fastpath_hooks.install(on_event=heard.append)
    model(input_ids=ids, labels=ids, **kwargs).loss.backward()
    out[name] = [e["message"] for e in heard if e.get("rule") == "attention.packed-leak"]
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.parametrize("transformers", ["this", "4.57.6"])
def test_in_a_fresh_process_each_case_says_what_it_should(transformers, request, tmp_path):
    started = time.monotonic()
    python = sys.executable if transformers == "this" else \
        request.getfixturevalue("make_venv")(transformers=transformers).python
    proc = subprocess.run([python, "-c", CHILD], capture_output=True, text=True, timeout=300,
                          env=venvs.clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), LOCAL_RANK="0"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    if transformers != "this":
        assert out["version"] == transformers
    assert out["wrapped"] is True
    assert out["ones"] == [LINE]
    assert out["nothing"] == [] and out["unpacked"] == []
    assert out["cache"] == ['llama: packed documents attend to each other under sdpa (use_cache=False, '
                            'or attn_implementation="flash_attention_2")']
    assert [line for line in proc.stderr.splitlines() if "packed documents" in line] == [
        PREFIX + out["ones"][0], PREFIX + out["cache"][0]]
    print(f"transformers {out['version']}: {time.monotonic() - started:.1f} s")


# -- doctor ------------------------------------------------------------------------------------------

def test_doctor_explains_the_leak_and_its_fix(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "doctor"], capture_output=True, text=True,
                          env=venvs.clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache")), timeout=120)
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("\nPacked rows", 1)[1].split("\n\n", 1)[0]
    import transformers

    assert f"under sdpa, eager, flex_attention transformers {transformers.__version__} keeps them apart only" in section
    assert "an attention mask (all ones too) or a cache" in section
    assert 'attention_mask=None and use_cache=False, or attn_implementation="flash_attention_2"' in section
    assert messages.PACKED_LEAK in section
