"""The smaller defects a new user met in their first hour (issue 17, defect 7), each in real processes
where it shows there:

- FASTPATH_HOOKS_TARGET: real arch-specific GPUs (sm_90a, sm_100a, sm_100f) are accepted as their GPU's
  arch; an arch no CUDA release knows (sm_999) is refused with the known list;
- `install(on_event=42)`: a TypeError at the call;
- the voice lock: one file per user in /tmp, however many environments speak;
- doctor on a machine without a GPU: the fix said once, in words a user knows;
- one bad variable: one line, and what is decided meanwhile respects the other settings.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import venv as venv_module

import pytest

from fastpath_hooks.facts.settings import Settings, SettingsError
from support import venvs
from fastpath_hooks.facts.environment import CUDA_ARCHS, known_cuda_archs, parse_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A100 = "gpu=sm_80,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes"


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPATH_HOOKS_", "_FASTPATH_HOOKS_", "PIP_"))
           and k not in ("LOCAL_RANK", "RANK", "LOCAL_WORLD_SIZE")}
    env.update(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), PIP_CONFIG_FILE=os.devnull, PYTHONPATH=ROOT)
    env.update({k: str(v) for k, v in extra.items()})
    return env


# -- the posed GPU's arch ---------------------------------------------------------------------

@pytest.mark.parametrize("given, arch", [("sm_90a", "sm_90"), ("sm_100a", "sm_100"), ("sm_100f", "sm_100"),
                                         ("sm_120a", "sm_120"), ("sm90a", "sm_90"), ("SM_86", "sm_86")])
def test_arch_specific_gpus_are_accepted_as_their_arch(given, arch):
    assert parse_target(f"gpu={given}")["gpus"] == (arch,)
    assert Settings.from_env({"FASTPATH_HOOKS_TARGET": f"gpu={given}+sm_80"}).target == f"gpu={given}+sm_80"


@pytest.mark.parametrize("given", ["sm_999", "sm_91", "sm_20", "sm_100x"])
def test_an_arch_no_cuda_release_knows_is_refused_with_the_known_list(given):
    with pytest.raises(SettingsError) as exc:
        Settings.from_env({"FASTPATH_HOOKS_TARGET": f"gpu={given}"})
    (var, value, why), = exc.value.problems
    assert var == "FASTPATH_HOOKS_TARGET" and value == f"gpu={given}"
    if given[-1].isdigit():
        assert f"{given} is not a CUDA GPU arch; known: sm_35 37 50" in why
        assert " 89 90 100 " in why and why.endswith(" 120 121")


def test_the_known_archs_are_the_cuda_releases_and_every_arch_the_pins_gencode_tables_name():
    from fastpath_hooks.facts import pins

    tables = [sb.cuda_archs for sb in pins.load().source_builds.values()]
    named = {arch for table in tables for arch in table}
    assert named and named <= set(known_cuda_archs())
    assert set(CUDA_ARCHS) <= set(known_cuda_archs())


def test_a_pinned_arch_beyond_the_cuda_list_is_known(tmp_path, monkeypatch):
    """A pins file (FASTPATH_HOOKS_PINS) whose -gencode table names a newer arch makes it posable."""
    import json

    user = tmp_path / "pins.json"
    user.write_text(json.dumps({"kernels": {"causal-conv1d": {"source_build": {"cuda_archs": {
        "pairs": {"sm_130": ">=14.0"}}}}}}))
    with pytest.raises(ValueError):
        parse_target("gpu=sm_130")
    monkeypatch.setenv("FASTPATH_HOOKS_PINS", str(user))
    assert parse_target("gpu=sm_130")["gpus"] == ("sm_130",)


def test_a_posed_sm_90a_gets_the_hopper_rule(tmp_path):
    """sm_90a is an H100: fla there with triton 3.6.0 needs tilelang, exactly as for sm_90."""
    proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "plan", "fla", "--target",
                           "gpu=sm_90a,cuda=12.8,torch=2.10.0,triton=3.6.0"],
                          capture_output=True, text=True, env=_env(tmp_path), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "fla#640" in proc.stdout, proc.stdout


# -- install(on_event=...) ------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [42, "print", ["a list"]])
def test_a_non_callable_on_event_is_a_type_error_at_the_call(tmp_path, bad):
    code = ("import fastpath_hooks, sys\n"
            f"try:\n    fastpath_hooks.install(on_event={bad!r})\n"
            "except TypeError as exc:\n    print('TypeError', exc)\n"
            "print('hooked' if any(type(f).__name__ == 'KernelImportFinder' for f in sys.meta_path) else 'nothing')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path))
    first, second = proc.stdout.splitlines()
    assert first.startswith("TypeError install(on_event=...) takes a callable") and type(bad).__name__ in first
    assert second == "nothing"     # nothing was changed by the refused call


# -- the voice lock: one file per user -------------------------------------------------------------

@pytest.fixture(scope="module")
def two_environments(tmp_path_factory):
    """Two real venvs (bare: `python -m venv` without pip), the package from this checkout on PYTHONPATH."""
    out = []
    for name in ("one", "two"):
        path = str(tmp_path_factory.mktemp("voice") / name)
        venv_module.EnvBuilder(with_pip=False).create(path)
        out.append(os.path.join(path, "bin", "python"))
    return out


SPEAK = r'''
import sys
import time
from fastpath_hooks import events, _names
events.status("hello from " + sys.prefix)
print(_names.environment_key())
'''


def test_speaking_from_many_environments_leaves_one_voice_file_per_user(two_environments, tmp_path):
    uid = os.getuid()
    keys = []
    for python in two_environments:
        proc = subprocess.run([python, "-c", SPEAK], capture_output=True, text=True, env=_env(tmp_path))
        assert proc.returncode == 0 and "fastpath-hooks: hello from" in proc.stderr, proc.stderr   # each speaks
        keys.append(proc.stdout.strip())
    assert len(set(keys)) == 2
    for key in keys:     # no file per environment
        assert not os.path.exists(f"/tmp/fastpath-hooks-{uid}-{key}.voice")
    assert os.path.isfile(f"/tmp/fastpath-hooks-{uid}.voice")


JOB = r'''
import os, sys, time
from fastpath_hooks import events
print("speaks" if events.speaks() else "quiet", flush=True)
sys.stdin.readline()
'''


def test_one_job_still_speaks_once_per_environment_with_the_one_file(two_environments, tmp_path):
    """Two processes of one parent in one environment: one voice; the same parent's process in another
    environment speaks for that one (the environment is part of the locked byte)."""
    one, two = two_environments
    procs = [subprocess.Popen([python, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=_env(tmp_path)) for python in (one, one, two)]
    try:
        said = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    assert sorted(said[:2]) == ["quiet", "speaks"] and said[2] == "speaks", said


# -- doctor on a machine without a GPU -------------------------------------------------------------

def test_doctor_without_a_gpu_says_the_fix_once_in_plain_words(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "doctor", "--target", "gpu=none"],
                          capture_output=True, text=True, env=_env(tmp_path), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    fix = "run on a machine with a CUDA (or XPU) GPU and a matching torch build"
    assert out.count(fix) == 1, out
    assert f"\nTo change it: {fix}." in out.split("Summary: ", 1)[1]
    assert "no device check" not in out
    if "(era C)" in out:
        assert "GPU or not" in out


# -- one bad variable: one line -----------------------------------------------------------------

DECIDE_ALL = r'''
import fastpath_hooks
fastpath_hooks.install()
for name in ("fla", "causal_conv1d", "mamba_ssm"):
    try:
        __import__(name)
    except ImportError:
        pass
from fastpath_hooks import engine
print({k: str(o.state) for k, o in sorted(engine.outcomes().items())})
'''


@pytest.mark.parametrize("bad", [{"FASTPATH_HOOKS_TIMEOUT": "abc"}, {"FASTPATH_HOOKS_RETRY_AFTR": "5"},
                                 {"FASTPATH_HOOKS_FIND_LINKS": "/nonexistent-wheelhouse"}])
def test_one_bad_variable_is_one_line_and_the_rest_still_counts(tmp_path, bad):
    house = tmp_path / "house"
    house.mkdir()
    settings = dict(FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_FIND_LINKS=str(house),
                    FASTPATH_HOOKS_SKIP="fla")
    settings.update(bad)
    proc = subprocess.run([sys.executable, "-c", DECIDE_ALL], capture_output=True, text=True, cwd=str(tmp_path),
                          env=_env(tmp_path, **settings))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fastpath-hooks:")]
    (var, value), = bad.items()
    # the value too where the line has room for it beside the reason and its fix (the whole in doctor, the debug log)
    assert len(lines) == 1 and lines[0].startswith((f"fastpath-hooks: {var}={value!r} is not valid",
                                                    f"fastpath-hooks: {var} is not valid")), proc.stderr
    assert len(lines[0]) <= 160 and "..." not in lines[0], lines[0]
    # meanwhile the decisions follow the valid settings: fla skipped (the skip list), nothing "would install"
    # from an index (offline, the wheelhouse is empty)
    assert "'fla': 'skipped'" in proc.stdout and "'causal-conv1d': 'skipped'" in proc.stdout, proc.stdout
    debug = subprocess.run([sys.executable, "-c", DECIDE_ALL], capture_output=True, text=True, cwd=str(tmp_path),
                           env=_env(tmp_path, FASTPATH_HOOKS_LOG="debug", **settings))
    assert "would install" not in debug.stderr and "offline" in debug.stderr, debug.stderr


def test_the_valid_part_keeps_offline_when_its_wheelhouse_is_the_bad_one():
    from fastpath_hooks.engine.context import _valid_part

    environ = {"FASTPATH_HOOKS_OFFLINE": "1", "FASTPATH_HOOKS_FIND_LINKS": "/nonexistent-wheelhouse",
               "FASTPATH_HOOKS_SKIP": "fla", "FASTPATH_HOOKS_TARGET": A100}
    with pytest.raises(SettingsError) as exc:
        Settings.from_env(environ)
    settings = _valid_part(environ, exc.value.problems)
    assert (settings.mode, settings.offline, settings.skip, settings.target) == ("report", True, {"fla"}, A100)


# -- issue 34's smaller defects ------------------------------------------------------------------

HOPPER = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes"   # fla#640: fla with tilelang; causal-conv1d's wheel


@pytest.fixture
def read_only_site(tmp_path):
    """(python, PYTHONPATH) of a venv whose site-packages cannot be written - a read-only bind mount where this
    machine lets the tests mount (as root a chmod stops nothing), else a chmod - seeing this checkout and the
    dev environment's packages (transformers, pip) through PYTHONPATH."""
    import glob
    import sysconfig

    venv = tmp_path / "ro-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))
    mounted = subprocess.run(["mount", "--bind", site, site], capture_output=True).returncode == 0
    if mounted and subprocess.run(["mount", "-o", "remount,bind,ro", site], capture_output=True).returncode != 0:
        subprocess.run(["umount", site], capture_output=True)
        mounted = False
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("cannot mount here, and a chmod does not stop root from writing")
        os.chmod(site, 0o555)
    try:
        yield str(venv / "bin" / "python"), os.pathsep.join([ROOT, sysconfig.get_paths()["purelib"]])
    finally:
        if mounted:
            subprocess.run(["umount", site], capture_output=True)
        else:
            os.chmod(site, 0o755)


def test_a_read_only_site_packages_is_one_cause_said_alike_and_doctor_says_it_cannot(read_only_site, tmp_path):
    """With site-packages read-only, doctor's Summary said "would install" with no "but cannot" (and its packed-
    sequence fix promised `fastpath-hooks install fla`), and the same cause was "could not install" for
    causal-conv1d but "blocked" for tilelang."""
    python, path = read_only_site
    env = _env(tmp_path, PYTHONPATH=path, FASTPATH_HOOKS_TARGET=HOPPER, LOCAL_RANK="0")
    doctor = subprocess.run([python, "-m", "fastpath_hooks", "doctor"], capture_output=True, text=True, env=env,
                            cwd=str(tmp_path))
    assert doctor.returncode == 0, doctor.stderr
    (summary,) = [line for line in doctor.stdout.splitlines() if line.startswith("Summary: ")]
    assert "would install" in summary and "but cannot: " in summary and "is not writable" in summary, summary
    assert "does it now" not in doctor.stdout, doctor.stdout
    proc = subprocess.run([python, "-m", "fastpath_hooks", "install"], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = {k: [line for line in proc.stderr.splitlines() if line.startswith(f"fastpath-hooks: {k}: ")]
            for k in ("tilelang", "causal-conv1d")}
    assert all(len(lines) == 1 for lines in said.values()), said
    why = {k: lines[0].split(": ", 2)[2] for k, lines in said.items()}
    assert why["tilelang"] == why["causal-conv1d"], why      # one cause, one way to say it
    assert why["tilelang"].startswith("not installed - ") and "is not writable" in why["tilelang"], why
    last = proc.stderr.splitlines()[-1]        # which kernels, and why the exit code, whole
    assert len(last) <= 160 and last.endswith("needed here but not usable (the reasons are above); exit 1"), last


def test_doctor_without_an_installer_promises_no_command_that_cannot_run():
    """doctor in a venv with no installer said "`fastpath-hooks install fla` does it now" (which exits 1 there)."""
    from dataclasses import replace

    from fastpath_hooks.decide.transformers import packed_sequences
    from fastpath_hooks.decide.policy import decide
    from fastpath_hooks.facts import pins as pins_mod
    from support.worlds import environment

    pins = pins_mod.load()
    for env, settings in ((environment(uv=None, pip=False), Settings()),
                          (environment(uv=None), Settings(installer="uv"))):
        plan = decide(env, settings, pins)
        failures = packed_sequences(plan, settings, pins, enabled=False)["failures"]
        fla = next(f for f in failures if f["package"] == "fla")
        assert "fastpath-hooks install" not in fla["fix"] and "uv" in fla["fix"], fla
        assert fla["problem"].startswith("fla is not installed") and "no installer can run here" in fla["problem"], fla


def test_a_huge_pins_file_is_refused_in_one_line_before_it_is_parsed(tmp_path):
    """A 208 MB FASTPATH_HOOKS_PINS file was parsed in every process (+1.1 GB). A pins file is small (the shipped
    one is about 56 KB): a bigger one than the bound is refused, unread, in one line; the shipped pins decide."""
    pins = tmp_path / "pins.json"
    with open(pins, "w") as fh:   # valid JSON, 32 MB of it
        fh.write('{"kernels": {}, "notes": "' + "x" * (32 << 20) + '"}')
    script = ("import importlib.util, fastpath_hooks; fastpath_hooks.install(); importlib.util.find_spec('fla');"
              "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])")   # kB, this image
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(tmp_path),
                          env=_env(tmp_path, FASTPATH_HOOKS_PINS=str(pins), FASTPATH_HOOKS_TARGET=A100, LOCAL_RANK="0"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "FASTPATH_HOOKS_PINS" in line]
    assert len(lines) == 1 and "is not valid" in lines[0] and "32 MB; a pins file is at most 1 MB" in lines[0], \
        proc.stderr
    assert int(proc.stdout.split()[-1]) < 64_000, f"{proc.stdout.split()[-1]} kB: the file was read"   # it was not read


def test_a_posed_target_in_a_training_process_is_said_in_one_line(tmp_path):
    """FASTPATH_HOOKS_TARGET in a training process (install() at its start) was not announced: every decision
    was for another machine, silently. Said in one line by the node's printing rank, once per environment
    and target (a line that would repeat at every start; later starts: the debug log), again for another."""
    start = [sys.executable, "-c", "import fastpath_hooks; fastpath_hooks.install(); fastpath_hooks.install()"]

    def said(target, **extra):
        env = _env(tmp_path, **{"FASTPATH_HOOKS_TARGET": target, "LOCAL_RANK": "0", **extra})
        proc = subprocess.run(start, capture_output=True, text=True, env=env, cwd=str(tmp_path))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr.splitlines()

    line = f"fastpath-hooks: posing {A100}: nothing here is real (FASTPATH_HOOKS_TARGET; unset it to decide for this machine)"
    assert said(A100, LOCAL_RANK="1") == []          # another rank of the node says nothing
    assert said(A100) == [line]                      # once in the process, though install() ran twice
    assert said(A100) == []                          # the settings known valid (a marker), the line said before
    assert any(line[len("fastpath-hooks: "):] in debug for debug in said(A100, FASTPATH_HOOKS_LOG="debug"))
    assert said(HOPPER) == [line.replace(A100, HOPPER)]   # another machine posed: said


# -- issue 40's defects ----------------------------------------------------------------------------

def _bare_venv(tmp_path):
    """(python, PYTHONPATH, site-packages) of a new venv without pip (made in well under a second) seeing this
    checkout and the dev environment's packages (packaging, filelock, pip, transformers) through PYTHONPATH."""
    import sysconfig

    venv = tmp_path / "venv"
    venv_module.EnvBuilder(with_pip=False).create(str(venv))
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return python, os.pathsep.join([ROOT, sysconfig.get_paths()["purelib"]]), site


def _fla_wheelhouse(tmp_path, pins=None, **fla):
    """(wheelhouse, pins file): a stand-in fla 0.6.0 (wheels.fake_fla's `fla` options), installed without its
    runtime dependencies (the wheelhouse has none); `pins`: more of the pins file."""
    from support import wheels

    house = tmp_path / "wheelhouse"
    wheels.fake_fla(str(house), "0.6.0", **fla)
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"kernels": {"fla": {"runtime_deps": []}, **(pins or {})}}))
    return house, path


START_AND_ASK = ("import importlib.util, fastpath_hooks; fastpath_hooks.install(); importlib.util.find_spec('fla');"
                 "print('went on')")


def _pins_refused(tmp_path, pins: str, fragment: str) -> None:
    """A training start and the command line with FASTPATH_HOOKS_PINS=`pins`: the start goes on with one line,
    the command line exits 2 with one; neither hangs nor prints a traceback."""
    env = _env(tmp_path, FASTPATH_HOOKS_PINS=pins, FASTPATH_HOOKS_TARGET=A100, LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "-c", START_AND_ASK], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 0 and proc.stdout == "went on\n" and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "pins" in line.lower()]
    assert len(said) == 1 and fragment in said[0] and len(said[0]) <= 160, proc.stderr
    cli = subprocess.run([sys.executable, "-m", "fastpath_hooks", "doctor"], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=60)
    assert cli.returncode == 2 and cli.stdout == "" and "Traceback" not in cli.stderr, cli.stderr
    assert len(cli.stderr.splitlines()) == 1 and fragment in cli.stderr, cli.stderr


def test_a_deeply_nested_pins_file_is_one_line_and_the_script_goes_on(tmp_path):
    """A 5,000-deep FASTPATH_HOOKS_PINS file: install() raised RecursionError (the script died) and the CLI
    printed a traceback. Now one "not valid" line; the training start goes on; the CLI exits 2."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    _pins_refused(tmp_path, str(deep), "not valid: nested more than 32 levels deep")
    shallow_enough = tmp_path / "deep40.json"    # parses, but deeper than any pins data: refused alike
    shallow_enough.write_text(json.dumps({"about": functools.reduce(lambda inner, _: [inner], range(40), 1)}))
    _pins_refused(tmp_path, str(shallow_enough), "not valid: nested more than 32 levels deep")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_pins_path_that_is_no_regular_file_is_refused_and_never_read(tmp_path, kind):
    """FASTPATH_HOOKS_PINS naming a FIFO hung every process forever (open() waits for a writer); /dev/zero
    would be read without end. Refused unread, in one line, as not a regular file."""
    path = {"fifo": str(tmp_path / "pins.fifo"), "directory": str(tmp_path / "pins.d"), "device": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    what = {"fifo": "is a named pipe", "directory": "is a directory", "device": "is a device"}[kind]
    _pins_refused(tmp_path, path, f"{what}; expected a JSON or TOML pins file")

    from fastpath_hooks.facts.pins import PinsError, load

    with pytest.raises(PinsError, match=what):   # the loader itself, given the path (plan --target reads it so)
        load(path)


def test_doctor_says_a_block_shadowed_by_an_earlier_sitecustomize_and_the_fix(tmp_path):
    """After `enable` (a block in the environment's sitecustomize.py), a sitecustomize.py earlier on PYTHONPATH
    runs instead: the hooks were silently off while doctor said "enabled". doctor says it is shadowed, by which
    file, and the fix (`--method pth`: .pth files run whatever PYTHONPATH holds); --json names both files."""
    python, base, site = _bare_venv(tmp_path)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "sitecustomize.py").write_text("SHADOW = True\n")
    env = _env(tmp_path, PYTHONPATH=base)
    shadowed = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(shadow), base]))

    def run(*args, env=env):
        proc = subprocess.run([python, "-m", "fastpath_hooks", *args], capture_output=True, text=True, env=env,
                              cwd=str(tmp_path), timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    run("enable", "--method", "sitecustomize")
    block = site + "/sitecustomize.py"
    (row,) = [line for line in run("doctor").splitlines() if "start-up" in line]
    assert row.split() == ["start-up", "enabled:", block]
    (row,) = [line for line in run("doctor", env=shadowed).splitlines() if "start-up" in line]
    assert "shadowed, so off at start" in row and "enabled" not in row, row
    assert str(shadow / "sitecustomize.py") in row and block in row and "`fastpath-hooks enable --method pth`" in row
    data = json.loads(run("doctor", "--json", env=shadowed))
    assert data["activation"]["shadowed"] == {block: str(shadow / "sitecustomize.py")}
    run("enable", "--method", "pth", env=shadowed)       # the fix works under the same PYTHONPATH
    (row,) = [line for line in run("doctor", env=shadowed).splitlines() if "start-up" in line]
    assert row.split()[:2] == ["start-up", "enabled:"] and row.split()[2].endswith("fastpath-hooks-startup.pth"), row


def test_a_failure_recorded_by_the_command_line_holds_at_the_next_start(tmp_path, toolkit):
    """`fastpath-hooks install fla` recorded fla's failed check; the next training start installed and rolled
    back again, and the verdict file held two fla keys: the start's model asked for causal-conv1d too, whose
    build decision read nvcc's release (`nvcc --version`, a toolkit without version.json), and that release
    was in fla's fingerprint. fla's key no longer holds it: the failure is remembered (RETRY_AFTER), one key."""
    house, pins = _fla_wheelhouse(tmp_path, broken="raise")
    python, path, _ = _bare_venv(tmp_path)
    env = _env(tmp_path, PYTHONPATH=path, FASTPATH_HOOKS_TARGET=A100,
               FASTPATH_HOOKS_FIND_LINKS=str(house), FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_PINS=str(pins),
               CUDA_HOME=toolkit.home, LOCAL_RANK="0")
    cli = subprocess.run([python, "-m", "fastpath_hooks", "install", "fla"], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=300)
    assert cli.returncode == 1 and "broken on purpose" in cli.stdout + cli.stderr, cli.stdout + cli.stderr
    start = ("import importlib.util, fastpath_hooks; fastpath_hooks.install();"
             "importlib.util.find_spec('causal_conv1d'); importlib.util.find_spec('fla')")   # as a Qwen3.5 model asks
    proc = subprocess.run([python, "-c", start], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "nvcc is CUDA 13.0" in proc.stderr, proc.stderr      # causal-conv1d's decision read nvcc's release
    (fla,) = [line for line in proc.stderr.splitlines() if line.startswith("fastpath-hooks: fla: ")]
    assert fla.startswith("fastpath-hooks: fla: failed ") and "(now: fastpath-hooks install fla)" in fla, proc.stderr
    assert "installing" not in proc.stderr and "rolled back" not in proc.stderr, proc.stderr
    (verdicts,) = (tmp_path / "cache" / "verdicts").glob("*.json")
    assert len(json.loads(verdicts.read_text())["kernels"]["fla"]) == 1


@pytest.mark.slow   # eight processes and a check child importing torch: about 12 s on 2 cores
def test_local_rank_0_that_waited_for_another_rank_says_the_outcome(tmp_path):
    """8 ranks with LOCAL_RANK/RANK: local rank 0 (the one that prints) found another rank installing, said
    "waiting for another process" and never how it ended (it waited in the roll-back of the running install's
    journal, where the outcome line was not said). Now it says the outcome; the other ranks say nothing."""
    house, pins = _fla_wheelhouse(tmp_path, check_seconds=3)   # the installing rank's check holds the lock 3 s
    python, path, site = _bare_venv(tmp_path)
    journal = os.path.join(site, ".fastpath-hooks", "journal.json")
    script = "import fastpath_hooks; fastpath_hooks.install(); import fla; print(fla.__version__)"

    def rank(i):
        env = _env(tmp_path, PYTHONPATH=path, FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_FIND_LINKS=str(house),
                   FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_PINS=str(pins), LOCAL_RANK=i, RANK=i, LOCAL_WORLD_SIZE=8,
                   WORLD_SIZE=8)
        return subprocess.Popen([python, "-c", script], env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    others = [rank(i) for i in range(1, 8)]
    deadline = time.monotonic() + 120
    while not os.path.exists(journal):   # one of them is installing: rank 0 comes while it is
        assert time.monotonic() < deadline and all(p.poll() is None for p in others), \
            [p.communicate() for p in others]
        time.sleep(0.01)
    results = [p.communicate(timeout=300) + (p.returncode,) for p in [rank(0)] + others]
    assert all(code == 0 and out == "0.6.0\n" for out, _, code in results), results
    assert [err for _, err, _ in results[1:]] == [""] * 7, results     # only local rank 0 prints
    said = [line for line in results[0][1].splitlines() if line.startswith("fastpath-hooks: fla: ")]
    assert said == ["fastpath-hooks: fla: waiting for another process that is installing or checking kernels "
                    "(at most 1800 s, FASTPATH_HOOKS_LOCK_TIMEOUT)",
                    "fastpath-hooks: fla: ready - done by another process while this one waited"], results[0][1]


def test_a_failed_fla_takes_the_tilelang_installed_for_it_along(tmp_path):
    """On a posed sm_90 with triton 3.6.0, fla needs tilelang (fla#640): tilelang (+ apache-tvm-ffi and its
    dependencies) was installed first, fla failed its check and was rolled back, and tilelang stayed, installed
    for nothing. Now what tilelang's install added is removed with fla, said in one line, and the next start
    remembers fla's failure without installing tilelang again."""
    from support import wheels
    from fastpath_hooks.facts import pins as pins_mod

    # tilelang's dependencies: einops here (the real one has five)
    house, pins = _fla_wheelhouse(tmp_path, {"tilelang": {"runtime_deps": ["einops"]}}, broken="raise")
    wheels.fake_tilelang_from_pins(str(house), "0.1.15", pins_mod.load())
    wheels.fake_tvm_ffi(str(house), "0.1.12")
    wheels.build_wheel(str(house), "einops", "0.8.2", {"einops/__init__.py": "__version__ = '0.8.2'\n"})
    python, path, site = _bare_venv(tmp_path)
    before = set(os.listdir(site))
    env = _env(tmp_path, PYTHONPATH=path, FASTPATH_HOOKS_TARGET=HOPPER, FASTPATH_HOOKS_FIND_LINKS=str(house),
               FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_PINS=str(pins), LOCAL_RANK="0")

    def start():
        proc = subprocess.run([python, "-c", START_AND_ASK],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr

    said = start()
    assert "tilelang: installed apache-tvm-ffi 0.1.12, tilelang 0.1.15 (+1 dependency)" in said, said
    assert "fla: could not install - verification failed" in said, said
    assert ("fastpath-hooks: rolled back tilelang too, installed for fla: removed apache-tvm-ffi 0.1.12; "
            "removed einops 0.8.2; removed tilelang 0.1.15\n") in said, said
    assert set(os.listdir(site)) - {".fastpath-hooks"} == before, sorted(os.listdir(site))   # nothing left
    said = start()
    assert "fastpath-hooks: fla: failed " in said and "installing" not in said, said
    assert set(os.listdir(site)) - {".fastpath-hooks"} == before


def test_a_shadowing_fla_directory_is_named_with_the_fix(tmp_path):
    """An `fla/` package earlier on PYTHONPATH (a stray checkout, an empty __init__.py) made the check fail with
    "No module named 'fla.modules'" and no word of why. The check child says where `fla` came from; the line
    names the shadowing directory and the fix (the error itself: the debug log)."""
    house, pins = _fla_wheelhouse(tmp_path)
    shadow = tmp_path / "checkouts"
    (shadow / "fla").mkdir(parents=True)
    (shadow / "fla" / "__init__.py").write_text("")
    short = f"/tmp/fph-{os.getpid()}"   # a path as short as a user's (~/src): the line holds it whole
    os.symlink(shadow, short)
    try:
        _shadowed_fla_is_named(tmp_path, short, pins, house)
    finally:
        os.unlink(short)


def _shadowed_fla_is_named(tmp_path, shadow, pins, house):
    python, path, _ = _bare_venv(tmp_path)
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(shadow), path]), FASTPATH_HOOKS_TARGET=A100,
               FASTPATH_HOOKS_FIND_LINKS=str(house), FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_PINS=str(pins),
               LOCAL_RANK="0")
    proc = subprocess.run([python, "-c", START_AND_ASK], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("fastpath-hooks: fla: could not")]
    assert line == (f"fastpath-hooks: fla: could not install - verification failed: import fla: {shadow}/fla "
                    "shadows the installed fla-core (move or rename it)"), proc.stderr
    debug = subprocess.run([python, "-m", "fastpath_hooks", "install", "fla"], capture_output=True, text=True,
                           env=dict(env, FASTPATH_HOOKS_LOG="debug"), cwd=str(tmp_path), timeout=300)
    assert "No module named 'fla.modules'" in debug.stderr, debug.stderr   # the error, for whoever asks


@pytest.mark.slow   # a check killed half-way, doctor (it imports transformers' hub mapping) and a recovery
def test_an_install_killed_mid_check_is_shown_as_rolled_back_not_installed(tmp_path):
    """After a SIGKILL during the check, doctor said "fla 0.6.0 installed" and "nothing to do" for files never
    verified, and the next start's line was garbled ("interrupted: install fla: fla 0.6.0 fits ... (restoring
    the state before it)"). doctor now says the install was killed half-way and is rolled back at the next
    start, decides as after that rollback, and the next start says what it rolls back in plain words."""
    import glob
    import signal

    house, pins = _fla_wheelhouse(tmp_path, check_seconds=20)   # killed while its check runs
    python, path, site = _bare_venv(tmp_path)
    journal = os.path.join(site, ".fastpath-hooks", "journal.json")
    env = _env(tmp_path, PYTHONPATH=path, FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_FIND_LINKS=str(house),
               FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_PINS=str(pins), LOCAL_RANK="0")
    victim = subprocess.Popen([python, "-c", START_AND_ASK], env=env, cwd=str(tmp_path), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (os.path.exists(journal) and glob.glob(os.path.join(site, "flash_linear_attention-*.dist-info"))):
            assert time.monotonic() < deadline and victim.poll() is None, "the install did not start"
            time.sleep(0.02)
        time.sleep(0.5)   # installed, now checking
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)

    doctor = subprocess.run([python, "-m", "fastpath_hooks", "doctor"], capture_output=True, text=True, env=env,
                            cwd=str(tmp_path), timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    (row,) = [line for line in doctor.stdout.splitlines() if line.startswith("  interrupted")]
    assert row.startswith("  interrupted   install of fla (fla-core 0.6.0, flash-linear-attention 0.6.0) (pid "), row
    assert "killed half-way - rolled back at the next start" in row, row
    fla = doctor.stdout.split("\n  fla\n", 1)[1].splitlines()[:3]
    assert fla[0] == ("    installed      no (fla-core 0.6.0, flash-linear-attention 0.6.0 on disk, never verified: "
                      "an interrupted install's, rolled back at the next start)"), fla
    assert fla[2].startswith("    install()      install fla-core==0.6.0, flash-linear-attention==0.6.0 - "), fla
    assert os.path.exists(journal)   # doctor touches nothing

    after = subprocess.run([python, "-c", "import fastpath_hooks; fastpath_hooks.install()"], capture_output=True,
                           text=True, env=dict(env, FASTPATH_HOOKS_SKIP="fla"), cwd=str(tmp_path), timeout=120)
    assert after.returncode == 0, after.stderr
    assert after.stderr.splitlines()[-2:] == [
        "fastpath-hooks: an earlier install of fla (fla-core 0.6.0, flash-linear-attention 0.6.0) was interrupted; "
        "rolling it back (stopped 1 process it left running)",   # its check child, asleep in `import fla.modules`
        "fastpath-hooks: rolled back: removed fla-core 0.6.0; removed flash-linear-attention 0.6.0"], after.stderr
    assert not os.path.exists(journal) and not glob.glob(os.path.join(site, "fl*"))


# -- what each way needs, said where a newcomer looks (issue 40) --------------------------------------

@pytest.mark.parametrize("command", ["doctor", "plan", "install", "download", "build"])
def test_every_target_option_says_its_format(command, capsys):
    """`--target`'s format was in no `--help` (only docs/settings.md): each says the key=value list, an example,
    the keys, and that a CPU torch needs a posed build for a GPU to count."""
    from fastpath_hooks import cli

    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--target SPEC" in text and "a comma list of key=value facts" in text, text
    for part in ("gpu=sm_90,cuda=12.8,torch=2.10.0", "cuda=, hip= or xpu=yes", "torch, cuda, hip, xpu, triton, "
                 "python, nvcc", "docs/settings.md#posing-as-another-"):
        assert part in text, (part, text)


def test_build_on_a_cpu_torch_host_says_what_it_needs_and_the_fix(tmp_path):
    """`fastpath-hooks build` with a CPU torch (README way 3 on a build host) exited 2 with a line cut before its fix,
    never saying that a build needs CUDA torch and nvcc but no GPU. One whole line now."""
    proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "build", "causal-conv1d", "--arch", "sm_90"],
                          capture_output=True, text=True, env=_env(tmp_path, PYTHONPATH=ROOT), cwd=str(tmp_path),
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    torch = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert proc.stderr == (f"fastpath-hooks: a build needs CUDA (or ROCm) torch and nvcc, no GPU: torch {torch} is a "
                           "CPU build (install the torch it runs with, or --target cuda=12.8)\n")
    assert len(proc.stderr.strip()) <= 160


def test_the_readme_says_what_its_commands_need():
    """The README's test command failed without pytest (the test extra was only in docs/development.md); its
    way 3 did not say that a build host needs the GPU machine's CUDA torch (a CPU torch skips everything) and
    `build` nvcc."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    tests = readme.index('python -m pytest -m "not slow" -q')
    assert 'pip install -e ".[test]"' in readme[tests - 80:tests], readme[tests - 200:tests + 60]
    way3 = readme[readme.index("3. **Ahead of time**"):readme.index("```bash", readme.index("3. **Ahead of time**"))]
    for part in ("the CUDA torch the GPU machine runs", "a CPU torch", "`--target`", "cuda=12.8", "nvcc",
                 "`fastpath-hooks install --help`"):
        assert part in " ".join(way3.split()), (part, way3)


@pytest.mark.parametrize("copy_in_site", [True, False], ids=["shadowed", "editable"])
def test_only_a_copy_beside_the_installed_one_is_called_a_shadow(copy_in_site, tmp_path, monkeypatch):
    """The shadow is named only where the distribution put its own copy in site-packages: an editable install
    (its package elsewhere, no copy there) that fails its import says the error itself."""
    from types import SimpleNamespace

    from fastpath_hooks.act.verify import verify_many

    site, elsewhere = tmp_path / "site", tmp_path / "src"
    (elsewhere / "kern_x").mkdir(parents=True)
    (elsewhere / "kern_x" / "__init__.py").write_text("")          # no kern_x.ops: the import fails
    info = site / "kern_x-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kern-x\nVersion: 1.0\n")
    (info / "RECORD").write_text("kern_x-1.0.dist-info/RECORD,,\n")
    if copy_in_site:
        (site / "kern_x").mkdir()
        (site / "kern_x" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    spec = SimpleNamespace(name="kern-x", verify_modules=("kern_x.ops",), verify_attributes=(),
                           distributions=("kern-x",))
    (result,) = verify_many([spec], timeout=60, env_extra=(("PYTHONPATH", f"{elsewhere}{os.pathsep}{site}"),))
    assert not result.ok
    if copy_in_site:
        assert result.detail == f"import kern_x.ops: {elsewhere / 'kern_x'} shadows the installed kern-x (move or rename it)"
    else:
        assert result.detail == "import kern_x.ops: ModuleNotFoundError: No module named 'kern_x.ops'", result.detail


@pytest.mark.slow
@pytest.mark.network   # setuptools 65.5 and, for the isolated build, the backend pyproject.toml names, from the index
def test_the_benchmarks_make_the_wheel_from_a_fresh_clone_with_an_old_setuptools(tmp_path):
    """Issue 40: `python3 benchmarks/warm_decision.py` in a fresh clone failed where that python's setuptools (65.5,
    a newcomer's) cannot build the project (`pip wheel --no-build-isolation`: its project.license): the benchmarks'
    wheel is made with the interpreter's own backend where it builds, else in pip's isolated build."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", ROOT, str(clone)], check=True, timeout=120)
    old = tmp_path / "old"
    subprocess.run([sys.executable, "-m", "venv", str(old)], check=True, timeout=120)
    py = str(old / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "setuptools==65.5.0", "packaging", "filelock"], check=True,
                   timeout=300, env=venvs.clean_env())
    code = ("import sys; sys.path.insert(0, 'tests'); from support import venvs; "
            "print(venvs.build_fastpath_wheel(sys.argv[1]))")
    proc = subprocess.run([py, "-c", code, str(tmp_path / "dist")], cwd=str(clone), capture_output=True, text=True,
                          timeout=600, env=venvs.clean_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.basename(proc.stdout.strip().splitlines()[-1]).startswith("fastpath_hooks-")
