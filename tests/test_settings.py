"""Every FASTPATH_HOOKS_* variable: bad values give an error naming the variable, the value
and what is accepted; good values parse to the right typed Settings."""

from __future__ import annotations

import os

import pytest

from fastpath_hooks._names import disabled
from fastpath_hooks._registry import REGISTRY
from fastpath_hooks.facts.settings import DEFAULT_TIMEOUT, VARIABLES, Settings, SettingsError, mirror_variables


@pytest.fixture
def paths(tmp_path):
    """Real filesystem objects the table refers to by placeholder."""
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("not a directory\n")
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    pins = tmp_path / "pins.json"
    pins.write_text("{}\n")
    return {"{file}": str(a_file), "{dir}": str(tmp_path), "{wheelhouse}": str(wheelhouse), "{pins}": str(pins),
            "{missing}": str(tmp_path / "does-not-exist")}


def fill(value: str, paths: dict) -> str:
    for key, path in paths.items():
        value = value.replace(key, path)
    return value


# variable -> (bad values, a fragment every message must contain: what is accepted)
BAD = {
    "FASTPATH_HOOKS_DISABLE": (["maybe", "2", "enable", "-1"], "1, true, yes, on"),
    "FASTPATH_HOOKS_SKIP": (["flaa", "fla,mamba", "causal", "fla;tilelang"], "fla, causal-conv1d, mamba-ssm, flash-attn, flash-attn-3, tilelang, flash-qla"),
    "FASTPATH_HOOKS_MODE": (["dry-run", "installl", "1"], "install, report"),
    "FASTPATH_HOOKS_FIND_LINKS": (["{missing}", "{file}", "ftp://mirror.example/wheels", "{wheelhouse},{missing}"],
                                  "directories or URLs"),
    "FASTPATH_HOOKS_OFFLINE": (["sometimes", "2"], "1, true, yes, on"),
    "FASTPATH_HOOKS_INDEX_URL": (["pypi.org/simple", "ftp://mirror.example/simple", "https://", "https://a b/simple"],
                                 "http://"),
    "FASTPATH_HOOKS_INSTALLER": (["conda", "pip3", "poetry"], "auto, uv, pip"),
    "FASTPATH_HOOKS_TIMEOUT": (["abc", "0", "-5", "nan", "inf", "10s"], "greater than 0"),
    "FASTPATH_HOOKS_ALLOW_BUILD": (["please", "y", "automatic", "2"], "auto"),
    "FASTPATH_HOOKS_SPLIT_COMPILE": (["yes", "-2", "four", "99999"], "auto"),
    "FASTPATH_HOOKS_CACHE_DIR": (["{file}"], "expected a directory"),
    "FASTPATH_HOOKS_PINS": (["{missing}", "{dir}"], "JSON or TOML pins file"),
    "FASTPATH_HOOKS_TARGET": (["sm_90", "gpu=sm_9", "gpu=sm_90,torch=latest", "gpu=sm_90,gpu=sm_80", "colour=blue",
                               "python=2.7", "cuda=12.8,hip=6.4", "os=beos", "nvcc=maybe", "platform=linux"],
                              "gpu="),
    "FASTPATH_HOOKS_LOG": (["verbose", "trace", "5"], "off, error, warning, info"),
    "FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL": (["github.com/x/releases", "s3://bucket/wheels"], "http://"),
    "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL": (["github.com/state-spaces/mamba/releases", "ftp://mirror/mamba"], "http://"),
    "FASTPATH_HOOKS_FLASH_ATTN_WHEEL_URL": (["github.com/Dao-AILab/flash-attention/releases"], "http://"),
    "FASTPATH_HOOKS_RETRY_AFTER": (["-1", "later", "inf"], ">= 0"),
    "FASTPATH_HOOKS_LOCK_TIMEOUT": (["0", "forever", "-3"], "greater than 0"),
}
# Target errors name the bad entry and what it should look like, not one fixed phrase:
TARGET_ACCEPTED = ("key=value", "sm_XY", "not a version", "given twice", "accepted:", "3.12", "one or the other",
                   "one of", "yes or no", "linux-x86_64")


def test_every_documented_variable_has_bad_value_rows():
    assert set(BAD) == set(VARIABLES)


@pytest.mark.parametrize("name,value", [(n, v) for n, (values, _) in BAD.items() for v in values])
def test_bad_value_names_variable_value_and_what_is_accepted(name, value, paths):
    value = fill(value, paths)
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    message = str(info.value)
    assert name in message
    assert repr(value) in message
    accepted = BAD[name][1]
    if name == "FASTPATH_HOOKS_TARGET":
        assert any(f in message for f in TARGET_ACCEPTED), message
    elif name == "FASTPATH_HOOKS_FIND_LINKS":
        assert "directory" in message or "URLs" in message, message
    else:
        assert accepted in message, message
    assert [p[0] for p in info.value.problems] == [name]


GOOD = [
    ({}, {}),
    ({"FASTPATH_HOOKS_DISABLE": "1"}, {"disable": True}),
    ({"FASTPATH_HOOKS_DISABLE": " YES "}, {"disable": True}),
    ({"FASTPATH_HOOKS_DISABLE": "off"}, {"disable": False}),
    ({"FASTPATH_HOOKS_SKIP": "fla, causal_conv1d"}, {"skip": frozenset({"fla", "causal-conv1d"})}),
    ({"FASTPATH_HOOKS_SKIP": "flash-linear-attention tilelang"}, {"skip": frozenset({"fla", "tilelang"})}),
    ({"FASTPATH_HOOKS_SKIP": "all"}, {"skip": frozenset({"fla", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3",
                                                         "tilelang", "flash-qla"})}),
    ({"FASTPATH_HOOKS_SKIP": "mamba_ssm"}, {"skip": frozenset({"mamba-ssm"})}),
    ({"FASTPATH_HOOKS_MODE": "Report"}, {"mode": "report"}),
    ({"FASTPATH_HOOKS_FIND_LINKS": "{wheelhouse}"}, {"find_links": ("{wheelhouse}",)}),
    ({"FASTPATH_HOOKS_FIND_LINKS": "{wheelhouse}, https://example.org/wheels/"},
     {"find_links": ("{wheelhouse}", "https://example.org/wheels/")}),
    ({"FASTPATH_HOOKS_FIND_LINKS": "{wheelhouse}", "FASTPATH_HOOKS_OFFLINE": "true"},
     {"find_links": ("{wheelhouse}",), "offline": True}),
    ({"FASTPATH_HOOKS_INDEX_URL": "https://pypi.example/simple"}, {"index_url": "https://pypi.example/simple"}),
    ({"FASTPATH_HOOKS_INDEX_URL": "file:///srv/simple"}, {"index_url": "file:///srv/simple"}),
    ({"FASTPATH_HOOKS_INSTALLER": "PIP"}, {"installer": "pip"}),
    ({"FASTPATH_HOOKS_TIMEOUT": "12.5"}, {"timeout": 12.5}),
    ({"FASTPATH_HOOKS_ALLOW_BUILD": "on"}, {"allow_build": "1"}),
    ({"FASTPATH_HOOKS_ALLOW_BUILD": "0"}, {"allow_build": "0"}),
    ({"FASTPATH_HOOKS_ALLOW_BUILD": "off"}, {"allow_build": "0"}),
    ({"FASTPATH_HOOKS_ALLOW_BUILD": "AUTO"}, {"allow_build": "auto"}),
    ({"FASTPATH_HOOKS_CACHE_DIR": "{dir}/cache-not-yet"}, {"cache_dir": "{dir}/cache-not-yet"}),
    ({"FASTPATH_HOOKS_SPLIT_COMPILE": "off"}, {"split_compile": "0"}),
    ({"FASTPATH_HOOKS_SPLIT_COMPILE": "08"}, {"split_compile": "8"}),
    ({"FASTPATH_HOOKS_PINS": "{pins}"}, {"pins_file": "{pins}"}),
    ({"FASTPATH_HOOKS_TARGET": "gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12"},
     {"target": "gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12"}),
    ({"FASTPATH_HOOKS_LOG": "debug"}, {"log": "debug"}),
    ({"FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL": "https://mirror.example/cc1d/"},
     {"wheel_urls": {"causal-conv1d": "https://mirror.example/cc1d/"}}),
    ({"FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL": "file:///mirror/mamba/"}, {"wheel_urls": {"mamba-ssm": "file:///mirror/mamba/"}}),
    ({"FASTPATH_HOOKS_RETRY_AFTER": "0"}, {"retry_after": 0.0}),
    ({"FASTPATH_HOOKS_LOCK_TIMEOUT": "60"}, {"lock_timeout": 60.0}),
    # an empty value counts as unset (`ENV FASTPATH_HOOKS_MODE=` in a Dockerfile)
    ({"FASTPATH_HOOKS_MODE": "", "FASTPATH_HOOKS_TIMEOUT": "  ", "FASTPATH_HOOKS_PINS": ""}, {}),
]


@pytest.mark.parametrize("environ,expected", GOOD, ids=[",".join(e) or "empty" for e, _ in GOOD])
def test_good_values_parse_to_typed_settings(environ, expected, paths):
    environ = {k: fill(v, paths) for k, v in environ.items()}
    settings = Settings.from_env(environ)
    want = {}
    for key, value in expected.items():
        if isinstance(value, str):
            value = fill(value, paths)
        elif isinstance(value, tuple):
            value = tuple(fill(v, paths) for v in value)
        want[key] = value
    defaults = Settings()
    for key in Settings.__dataclass_fields__:
        if key == "explicit":
            continue
        assert getattr(settings, key) == want.get(key, getattr(defaults, key)), key
    assert settings.explicit == {k for k, v in environ.items() if v.strip()}


def test_defaults():
    s = Settings.from_env({})
    assert (s.disable, s.mode, s.installer, s.timeout, s.offline, s.allow_build, s.log) == \
        (False, "install", "auto", DEFAULT_TIMEOUT, False, "auto", "info")
    assert s.public()["skip"] == [] and s.explicit == frozenset()


@pytest.mark.parametrize("typo,suggestion", [
    ("FASTPATH_HOOKS_OFLINE", "FASTPATH_HOOKS_OFFLINE"),
    ("FASTPATH_HOOKS_SKIPS", "FASTPATH_HOOKS_SKIP"),
    ("FASTPATH_HOOKS_FINDLINKS", "FASTPATH_HOOKS_FIND_LINKS"),
    ("FASTPATH_HOOKS_TIMEOUTS", "FASTPATH_HOOKS_TIMEOUT"),
])
def test_unknown_variable_is_reported_with_a_suggestion(typo, suggestion):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({typo: "1"})
    assert f"{typo}='1'" in str(info.value)
    assert f"did you mean {suggestion}?" in str(info.value)


def test_unknown_variable_without_a_close_match_points_to_doctor():
    with pytest.raises(SettingsError, match="FASTPATH_HOOKS_QQQ='x'.*unknown variable.*fastpath-hooks doctor"):
        Settings.from_env({"FASTPATH_HOOKS_QQQ": "x"})


def test_offline_without_find_links_says_how_to_make_a_wheelhouse():
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"FASTPATH_HOOKS_OFFLINE": "1"})
    message = str(info.value)
    assert "FASTPATH_HOOKS_OFFLINE='1'" in message and "FASTPATH_HOOKS_FIND_LINKS" in message
    assert "fastpath-hooks download --dest DIR" in message


def test_offline_with_a_bad_find_links_reports_only_the_real_problem(paths):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"FASTPATH_HOOKS_OFFLINE": "1", "FASTPATH_HOOKS_FIND_LINKS": paths["{missing}"]})
    assert [p[0] for p in info.value.problems] == ["FASTPATH_HOOKS_FIND_LINKS"]
    assert "is not a directory" in str(info.value)


def test_every_bad_variable_is_reported_at_once():
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"FASTPATH_HOOKS_MODE": "x", "FASTPATH_HOOKS_TIMEOUT": "y", "FASTPATH_HOOKS_SKIP": "z"})
    assert sorted(p[0] for p in info.value.problems) == [
        "FASTPATH_HOOKS_MODE", "FASTPATH_HOOKS_SKIP", "FASTPATH_HOOKS_TIMEOUT"]


def test_unknown_kernel_gets_a_suggestion():
    with pytest.raises(SettingsError, match="did you mean causal-conv1d"):
        Settings.from_env({"FASTPATH_HOOKS_SKIP": "causal-conv"})


def test_with_target_validates_the_spec():
    s = Settings().with_target("gpu=sm_80,cuda=12.8")
    assert s.target == "gpu=sm_80,cuda=12.8"
    with pytest.raises(SettingsError, match="--target='gpu=banana'"):
        Settings().with_target("gpu=banana")


def test_from_env_reads_os_environ(monkeypatch):
    monkeypatch.setenv("FASTPATH_HOOKS_MODE", "report")
    assert Settings.from_env().mode == "report"


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), (" On", True), ("0", False), ("", False),
                                            ("garbage", False)])
def test_start_up_disable_check(value, expected):
    assert disabled({"FASTPATH_HOOKS_DISABLE": value}) is expected


def test_public_view_is_json_ready(paths):
    import json

    s = Settings.from_env({"FASTPATH_HOOKS_SKIP": "tilelang,fla", "FASTPATH_HOOKS_FIND_LINKS": paths["{wheelhouse}"]})
    data = json.loads(json.dumps(s.public()))
    assert data["skip"] == ["fla", "tilelang"] and data["find_links"] == [paths["{wheelhouse}"]]
    # every setting, plus allow_build_mode: allow_build stays the boolean doctor/2 documents
    # cache_dir_refused: cache_dir_unusable's parts, for the short line
    assert set(data) == set(Settings.__dataclass_fields__) - {"explicit", "cache_dir_refused"} | {"allow_build_mode"}
    assert (data["allow_build"], data["allow_build_mode"]) == (True, "auto")
    assert Settings.from_env({"FASTPATH_HOOKS_ALLOW_BUILD": "0"}).public()["allow_build"] is False
    assert os.path.isabs(data["find_links"][0])


# -- one parser per variable: the start-up path's raw readers and settings agree -------------------

def test_the_start_up_readers_and_settings_agree(tmp_path):
    from fastpath_hooks import _names

    wheelhouse = tmp_path / "wh"
    wheelhouse.mkdir()
    rows = {
        _names.DISABLE: (["1", "TRUE", " yes ", "on", "0", "off", "no", "maybe", "2"], _names.disabled, "disable"),
        _names.LOG: (["debug", "INFO", " warning ", "off", "error", "status", "verbose", ""], _names.log_level, "log"),
        _names.CACHE_DIR: ([str(tmp_path / "c"), "~/x", "rel/dir", " ", str(wheelhouse)], _names.cache_dir_given,
                           "cache_dir"),
        _names.FIND_LINKS: ([str(wheelhouse), f"{wheelhouse}, {wheelhouse}", f" {wheelhouse}\t{wheelhouse}",
                             "https://x.example/w"], _names.find_links_given, "find_links"),
    }
    for name, (values, reader, field) in rows.items():
        for raw in values:
            raw_value = reader({name: raw})
            try:
                parsed = getattr(Settings.from_env({name: raw}), field)
            except SettingsError:
                # invalid: the start-up path falls back to the default (the bad value is said at install())
                assert name in (_names.DISABLE, _names.LOG), (name, raw)
                assert raw_value in (False, None), (name, raw, raw_value)
                continue
            if name == _names.LOG and not raw.strip():
                assert parsed == raw_value == _names.DEFAULT_LOG
            elif name == _names.CACHE_DIR and not raw.strip():
                assert parsed is None and raw_value is None
            elif name == _names.CACHE_DIR:   # the root each uses: a refused one (relative) is the default root
                assert _names.cache_root_from_environ({name: raw}) == (parsed or _names.default_cache_root({}))
                assert parsed == (raw_value if os.path.isabs(raw_value) else None), (raw, parsed, raw_value)
            else:
                assert parsed == raw_value, (name, raw, parsed, raw_value)


def test_a_bad_log_level_is_said_with_the_fix(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPATH_HOOKS_")}
    env.update(FASTPATH_HOOKS_LOG="verbose", FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", "import fastpath_hooks; fastpath_hooks.install()"], env=env,
                          capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if "FASTPATH_HOOKS_LOG" in ln]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr
    assert "'verbose'" in lines[0] and "off, error, warning, info, debug" in lines[0]


# -- the settings table of docs/settings.md is settings.VARIABLES ------------------------------------

def _documented_settings_table() -> list:
    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "settings.md")
    with open(doc, encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("\n## Variables\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `FASTPATH_HOOKS_"):
            name, meaning = (cell.strip() for cell in line.strip().strip("|").split("|", 1))
            rows.append((name.strip("`"), meaning))
    return rows


def test_the_documented_settings_table_is_the_variables_of_settings():
    assert _documented_settings_table() == list(VARIABLES.items())


def test_the_defaults_the_table_names_are_the_parsed_defaults():
    import re

    defaults = Settings()
    fields = {"FASTPATH_HOOKS_PINS": "pins_file", "FASTPATH_HOOKS_TARGET": "target"}
    checked = 0
    mirrors = {variable: kernel for kernel, variable in mirror_variables(REGISTRY).items()}
    for name, meaning in _documented_settings_table():
        field = fields.get(name, name[len("FASTPATH_HOOKS_"):].lower())
        value = defaults.wheel_urls.get(mirrors[name]) if name in mirrors else getattr(defaults, field)
        if value is None:   # CACHE_DIR: unset means the user cache dir (its default is not a setting)
            assert "(default" not in meaning or "(default: the user cache dir" in meaning, name
            continue
        number = re.search(r"\(default (\d+)\)", meaning)
        word = re.search(r"(\w+) \(default", meaning)
        if number:
            assert value == float(number.group(1)), name
            checked += 1
        elif word:
            assert str(value) == word.group(1), (name, value, word.group(1))
            checked += 1
    assert checked == 8  # TIMEOUT, RETRY_AFTER, LOCK_TIMEOUT; MODE, INSTALLER, ALLOW_BUILD, SPLIT_COMPILE, LOG
