"""The human line and the events, in this process (fast): `fit` keeps a line short without losing its
sentence, its fix or a build log's path; every event reaches every `on_event` listener as its own
JSON-ready dict, a listener that raises breaks nothing; `once` and `persist` say a line once per process
and once per environment. test_messages.py checks the same lines in real processes and real launches."""

from __future__ import annotations

import json

import pytest

from fastpath_hooks import events

SENTENCE = "causal-conv1d: not installed - the wheel at"
FIX = "Fix: fastpath-hooks cache clear causal-conv1d"
LONG_PATH = "/home/someone/.cache/fastpath-hooks/wheels/" + "x" * 120 + "/causal_conv1d-1.6.2.post1-cp312.whl"


@pytest.fixture
def voice(monkeypatch, tmp_path):
    """This process speaks (local rank 0), at the default level, with its own cache; forgets what it said."""
    for name in ("FASTPATH_HOOKS_LOG", "_FASTPATH_HOOKS_VOICE", "RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))
    events.forget()
    events.clear_listeners()
    yield
    events.forget()
    events.clear_listeners()


def lines(capsys) -> list:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(events.PREFIX)]


# -- fit: one short line --------------------------------------------------------------------------

def test_a_short_message_is_one_prefixed_line_as_it_is():
    assert events.fit("fla: ready\n  (checked once)") == "fastpath-hooks: fla: ready (checked once)"


def test_a_long_word_is_cut_in_its_middle_and_the_sentence_and_fix_stay():
    line = events.fit(f"{SENTENCE} {LONG_PATH} is damaged. {FIX}")
    assert len(line) <= events.MAX_LINE, line
    assert line.startswith(events.PREFIX + SENTENCE + " /home/someone/") and line.endswith("is damaged. " + FIX)
    cut = line.split()[len(SENTENCE.split()) + 1]
    assert "..." in cut and cut.endswith("-cp312.whl"), cut     # both ends of the path stay: where, and which file


def test_only_the_value_of_a_variable_is_cut():
    line = events.fit(f"FASTPATH_HOOKS_FIND_LINKS='{'w' * 300}' is not a directory; {FIX}")
    assert len(line) <= events.MAX_LINE and line.endswith(FIX), line
    assert line.split()[1].startswith("FASTPATH_HOOKS_FIND_LINKS='w") and "..." in line.split()[1]


def test_a_build_logs_path_is_never_cut():
    log = "/tmp/fastpath-hooks-build-" + "b" * 150 + "/causal-conv1d.log"
    line = events.fit(f"causal-conv1d: the build failed; its log: {log}; {'and more words ' * 10}")
    assert log in line and len(line) > events.MAX_LINE     # past the limit rather than without the log
    assert line.endswith(log + ";..."), line


def test_many_short_words_are_cut_at_the_end():
    line = events.fit("word " * 100)
    assert events.MAX_LINE - 8 <= len(line) <= events.MAX_LINE and line.endswith(" word..."), line   # at a word's end


def test_a_handed_over_error_chain_keeps_what_failed_and_the_error_itself():
    from fastpath_hooks.events import fitted

    head = "fla: failed, retry in 60 min (FASTPATH_HOOKS_RETRY_AFTER): "
    chain = "verification failed: import fla: ImportError: fake fla 0.6.0: broken on purpose (tests)"
    line = events.PREFIX + fitted(head, chain)
    assert len(line) <= events.MAX_LINE, line
    assert (head + "verification failed: ... broken on purpose (tests) (the whole: fastpath-hooks doctor)") in line
    short = fitted("fla: could not install - ", chain)   # whole when it fits
    assert short == "fla: could not install - " + chain, short


def test_a_chain_whose_error_would_be_cut_to_a_few_characters_is_cut_at_its_end():
    from fastpath_hooks.events import fitted

    error = ("import flash_qla: ValueError: FlashQLA now support sm90, sm100, sm103, sm120 and sm121 only. "
             "Found compute version: 8.0")   # a middle cut would leave "... 8.0"
    line = fitted("flash-qla: could not verify it - ", error, "fla keeps its own path")
    assert "import flash_qla: ValueError: FlashQLA now... (fla keeps its own path" in line and ": ... " not in line, line
    assert len(events.PREFIX + line) <= events.MAX_LINE, line


def test_a_text_that_is_no_chain_is_cut_at_its_end():
    from fastpath_hooks.events import fitted

    line = fitted("FASTPATH_HOOKS_SKIP='bogus' is not valid, so nothing is installed: ",
                  "unknown kernel; accepted: " + ", ".join(f"kernel-{i}" for i in range(20)))
    assert "unknown kernel; accepted: kernel-0,... (the whole: fastpath-hooks doctor)" in line, line


# -- events: every listener, its own dict ---------------------------------------------------------

def test_every_listener_gets_its_own_json_ready_event_and_a_raising_one_breaks_nothing(voice, capsys):
    got_a, got_b = [], []

    def changes_it(event):
        event["message"] = "changed by a listener"
        got_a.append(event)

    def raises(event):
        raise RuntimeError("a listener's bug")

    for callback in (changes_it, raises, got_b.append):
        events.add_listener(callback)
    events.add_listener(changes_it)                    # the same callback twice: called once
    returned = events.warning("fla: blocked", kernel="fla", rule="fla.hazard.block")
    assert [e["message"] for e in got_a] == ["changed by a listener"]
    (event,) = got_b
    assert event == {"type": "warning", "kernel": "fla", "message": "fla: blocked", "ts": returned["ts"],
                     "rule": "fla.hazard.block"}
    assert json.loads(json.dumps(event)) == event
    assert lines(capsys) == ["fastpath-hooks: fla: blocked"]


def test_debug_events_reach_listeners_but_print_only_at_debug(voice, monkeypatch, capsys):
    got = []
    events.add_listener(got.append)
    events.debug("wheel cache: ignoring x.whl")
    assert [e["type"] for e in got] == ["status"] and lines(capsys) == []
    monkeypatch.setenv("FASTPATH_HOOKS_LOG", "debug")
    events.debug("wheel cache: ignoring y.whl")
    assert lines(capsys) == ["fastpath-hooks: wheel cache: ignoring y.whl"]


def test_the_level_filters_the_lines_and_off_silences_them(voice, monkeypatch, capsys):
    monkeypatch.setenv("FASTPATH_HOOKS_LOG", "warning")
    events.status("fla: ready")
    events.warning("fla: blocked")
    monkeypatch.setenv("FASTPATH_HOOKS_LOG", "off")
    events.error("fla: failed")
    assert lines(capsys) == ["fastpath-hooks: fla: blocked"]


def test_a_rank_other_than_zero_prints_nothing_but_its_listeners_hear_everything(voice, monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")
    got = []
    events.add_listener(got.append)
    events.error("fla: failed")
    assert lines(capsys) == [] and [e["message"] for e in got] == ["fla: failed"]


# -- said once ------------------------------------------------------------------------------------

def test_once_is_once_per_process_until_forgotten(voice, capsys):
    for _ in range(3):
        events.error("internal error, leaving this import alone", once="internal")
    assert len(lines(capsys)) == 1
    events.forget()                                     # uninstall() starts afresh
    events.error("internal error, leaving this import alone", once="internal")
    assert len(lines(capsys)) == 1


def test_persist_is_once_per_environment_then_at_debug_until_refresh(voice, monkeypatch, capsys):
    skip = "fla: not installed - no CUDA/XPU accelerator"
    events.status(skip, persist="skip.no-accelerator " + skip)
    events.status(skip, persist="skip.no-accelerator " + skip)
    assert lines(capsys) == ["fastpath-hooks: " + skip]
    events.status("fla: ready", persist="fla.ok fla: ready")          # another decision: said
    assert lines(capsys) == ["fastpath-hooks: fla: ready"]
    monkeypatch.setenv("FASTPATH_HOOKS_LOG", "debug")
    events.status(skip, persist="skip.no-accelerator " + skip)
    assert lines(capsys) == ["fastpath-hooks: (said before) " + skip]
    monkeypatch.delenv("FASTPATH_HOOKS_LOG")
    assert events.forget_said() is True                 # `doctor --refresh`
    events.status(skip, persist="skip.no-accelerator " + skip)
    assert lines(capsys) == ["fastpath-hooks: " + skip]
