"""What fastpath-hooks prints, in real processes: short lines, one process per node, silent workers,
a repeating skip said once per environment, one-line `download --dest` errors, and an environment
without any installer (a `uv venv`: no pip, no uv on PATH).

The CPU-only scenarios run this dev environment's interpreter in report mode (FASTPATH_HOOKS_MODE=report
installs nothing) posing as GPU machines; the installer scenario uses a real fresh `uv venv`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import A100, H100_OLD_TRITON
from support import guarded, venvs

MAX = 160

# slow: every scenario is real processes and launches (tests/test_events.py checks the lines in this process)
pytestmark = pytest.mark.slow
# install(), then the decision of each kernel (what era C's `import fla` triggers), then wait for
# argv[1] (a directory) to hold argv[2] files: processes started together stay alive together.
DECIDE = textwrap.dedent('''
    import importlib.util, os, sys, time
    import fastpath_hooks
    fastpath_hooks.install()
    for module in ("fla", "causal_conv1d", "tilelang"):
        try:
            importlib.util.find_spec(module)
        except ImportError:
            pass
    if len(sys.argv) > 2:
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
        deadline = time.time() + 60
        while len(os.listdir(sys.argv[1])) < int(sys.argv[2]) and time.time() < deadline:
            time.sleep(0.01)
''')


def human(stderr: str, *, short: bool = True) -> list[str]:
    """short: every line fits MAX (FASTPATH_HOOKS_LOG=debug prints them whole)."""
    lines = [line for line in stderr.splitlines() if line.startswith("fastpath-hooks:")]
    too_long = [line for line in lines if len(line) > MAX]
    assert not (short and too_long), too_long
    assert "Traceback" not in stderr, stderr
    return lines


def env_for(tmp_path, name: str = "cache", **extra) -> dict:
    return venvs.clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / name), **extra)


def decide(env: dict, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DECIDE, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run(env: dict) -> list[str]:
    proc = decide(env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return human(err, short=env.get("FASTPATH_HOOKS_LOG") != "debug")


# -- every line short ----------------------------------------------------------------------

SCENARIOS = {
    "cpu": {},
    "a100, report": {"FASTPATH_HOOKS_TARGET": A100, "FASTPATH_HOOKS_MODE": "report"},
    "hopper hazard, no nvcc": {"FASTPATH_HOOKS_TARGET": H100_OLD_TRITON.replace("nvcc=yes", "nvcc=no"),
                               "FASTPATH_HOOKS_MODE": "report"},
    "hopper, fla installed": {"FASTPATH_HOOKS_TARGET": H100_OLD_TRITON.replace("nvcc=yes", "nvcc=no")
                              + ",fla-core=0.4.1"},
    "rocm": {"FASTPATH_HOOKS_TARGET": "gpu=gfx942,hip=6.4,torch=2.10.0,triton=3.6.0", "FASTPATH_HOOKS_MODE": "report"},
    "old python": {"FASTPATH_HOOKS_TARGET": A100 + ",python=3.8.10", "FASTPATH_HOOKS_MODE": "report"},
    "invalid variable": {"FASTPATH_HOOKS_TARGET": A100, "FASTPATH_HOOKS_RETRY_AFTER": "soon",
                         "FASTPATH_HOOKS_TIMEOUT": "x" * 300},
    "missing pins file": {"FASTPATH_HOOKS_TARGET": A100, "FASTPATH_HOOKS_PINS": "/nonexistent/" + "p" * 200 + ".json"},
    "debug": {"FASTPATH_HOOKS_TARGET": A100, "FASTPATH_HOOKS_MODE": "report", "FASTPATH_HOOKS_LOG": "debug"},
}


def test_every_line_of_the_common_scenarios_is_short(tmp_path):
    # started together, so each says it is local rank 0 (else one process of the lot would speak)
    procs = {name: decide(env_for(tmp_path, name.replace(" ", "-").replace(",", ""), LOCAL_RANK="0", **extra))
             for name, extra in SCENARIOS.items()}
    said = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err)
        said[name] = human(err, short=SCENARIOS[name].get("FASTPATH_HOOKS_LOG") != "debug")
    # the scenarios really said things (a test of nothing would pass too)
    print(json.dumps(said, indent=1))
    assert all(said[name] for name in SCENARIOS), said
    assert any("would install" in line for line in said["a100, report"]), said["a100, report"]
    assert any("blocked" in line for line in said["hopper, fla installed"]), said["hopper, fla installed"]
    assert any("FASTPATH_HOOKS_TIMEOUT" in line for line in said["invalid variable"]), said["invalid variable"]
    # debug prints each line whole: the short line, then the long reason after it (the posed target's line
    # has no more to say: it is whole already)
    for line in said["a100, report"]:
        if line.startswith("fastpath-hooks: posing "):
            assert line in said["debug"], (line, said["debug"])
        else:
            assert any(whole.startswith(line + "; ") for whole in said["debug"]), (line, said["debug"])
    # the CLI's lines too: doctor/plan write their report to stdout, errors to stderr
    for args in (["doctor"], ["plan"], ["install", "--dry-run", "--target", A100], ["plan", "nokernel"],
                 ["doctor", "--target", "gpu=" + "z" * 200]):
        proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", *args], env=env_for(tmp_path),
                              capture_output=True, text=True, timeout=300)
        human(proc.stderr)
        summary = [line for line in proc.stdout.splitlines() if line.startswith("Summary:")]
        assert all(len(line) <= MAX for line in summary), summary


# -- one process per node ------------------------------------------------------------------

def _together(tmp_path, envs: list[dict]) -> list[list[str]]:
    """Start the processes at once; each decides, then waits until all have decided."""
    meeting = tmp_path / f"meet-{time.monotonic_ns()}"
    meeting.mkdir()
    procs = [decide(env, str(meeting), str(len(envs))) for env in envs]
    out = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        out.append(human(err))
    return out


@pytest.mark.parametrize("ranks", ["none", "LOCAL_RANK", "RANK+LOCAL_WORLD_SIZE"])
def test_one_process_per_node_prints(tmp_path, ranks):
    """Four processes of one job, each with its own cache (so nothing is remembered between them):
    each has the same thing to say, one says it."""
    envs = []
    for i in range(4):
        extra = {"LOCAL_RANK": str(i)} if ranks == "LOCAL_RANK" else \
            {"RANK": str(4 + i), "LOCAL_WORLD_SIZE": "4"} if ranks == "RANK+LOCAL_WORLD_SIZE" else {}
        envs.append(env_for(tmp_path, f"cache-{ranks}-{i}", FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_MODE="report",
                            **extra))
    said = _together(tmp_path, envs)
    speakers = [i for i, lines in enumerate(said) if lines]
    assert len(speakers) == 1, said
    if ranks != "none":
        assert speakers == [0], said       # local rank 0 (RANK 4 of LOCAL_WORLD_SIZE 4)
    assert any("would install" in line for line in said[speakers[0]])


def test_processes_of_different_parents_each_speak(tmp_path):
    """Without rank variables, one parent's children are one job: two jobs (two parents) each print."""
    meeting = tmp_path / "meet"
    meeting.mkdir()
    # each job: a parent shell that starts one decider; both deciders alive together
    code = f"{sys.executable} -c \"$DECIDE\" {meeting} 2; exit $?"   # not exec'd: the shell stays the parent
    procs = [subprocess.Popen(["sh", "-c", code], env=dict(env_for(tmp_path, f"job{i}", FASTPATH_HOOKS_TARGET=A100,
                                                                     FASTPATH_HOOKS_MODE="report"), DECIDE=DECIDE),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    said = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        said.append(human(err))
    assert all(said), said


SAYS = textwrap.dedent('''
    import os, sys, time
    from fastpath_hooks import events
    meeting, who = sys.argv[1], sys.argv[2]
    if who == "b":
        while not os.path.exists(os.path.join(meeting, "a")):
            time.sleep(0.02)
        events.status("fla: installed fla 0.6.0 in 1.0 s with uv")
    else:   # the posed target's line, once per environment: said at the first start (p0), not again (a)
        events.warning("posing gpu=sm_80: nothing here is real", persist="posed:gpu=sm_80")
    if who == "a":
        open(os.path.join(meeting, "a"), "w").close()
        while not os.path.exists(os.path.join(meeting, "b")):
            time.sleep(0.02)
    if who == "b":
        open(os.path.join(meeting, "b"), "w").close()
''')


def test_a_process_that_says_nothing_now_leaves_the_voice_to_one_that_does(tmp_path):
    """A line said at an earlier start is not said again - and saying nothing does not take the node's voice: a
    sibling started beside it (one parent) that has an install to tell still speaks."""
    env = env_for(tmp_path)
    meeting = tmp_path / "meet"
    meeting.mkdir()

    def start(who):
        return subprocess.Popen([sys.executable, "-c", SAYS, str(meeting), who], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    first = start("p0").communicate(timeout=120)[1]
    assert human(first) == ["fastpath-hooks: posing gpu=sm_80: nothing here is real"], first
    a, b = start("a"), start("b")
    said = [human(p.communicate(timeout=120)[1]) for p in (a, b)]
    assert said == [[], ["fastpath-hooks: fla: installed fla 0.6.0 in 1.0 s with uv"]], said


WORKERS = textwrap.dedent('''
    import importlib.util, multiprocessing, sys
    import fastpath_hooks

    def child(_=None):
        importlib.util.find_spec("fla")
        return 0

    if __name__ == "__main__":
        fastpath_hooks.install()
        kind = sys.argv[1]
        if kind == "dataloader":
            import torch.utils.data as data

            class Kernels(data.Dataset):
                def __len__(self):
                    return 4

                def __getitem__(self, i):
                    return child()

            assert list(data.DataLoader(Kernels(), num_workers=2, batch_size=None)) == [0, 0, 0, 0]
        else:
            ctx = multiprocessing.get_context(kind)
            p = ctx.Process(target=child)
            p.start()
            p.join()
            assert p.exitcode == 0
        sys.stderr.write("-- parent --\\n")
        sys.stderr.flush()
        child()
''')


@pytest.mark.parametrize("kind", ["fork", "spawn", "dataloader"])
def test_workers_that_inherit_local_rank_zero_print_nothing(tmp_path, kind):
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    proc = subprocess.run([sys.executable, str(script), kind], env=env_for(tmp_path, LOCAL_RANK="0"),
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    before, after = proc.stderr.split("-- parent --\n")
    assert human(before) == [], before
    assert len(human(after)) == 1 and "no CUDA/XPU accelerator" in after, after   # the parent had it to say


SPAWNED_RANKS = textwrap.dedent('''
    import importlib.util, os, sys
    import torch.multiprocessing as mp

    def rank(i):
        os.environ["LOCAL_RANK"] = str(i)   # as a training function started by mp.spawn sets it
        import fastpath_hooks

        fastpath_hooks.install()
        importlib.util.find_spec("fla")

    if __name__ == "__main__":
        mp.spawn(rank, nprocs=2)
''')


def test_ranks_started_by_spawn_from_a_plain_script_speak_once(tmp_path):
    """torch.multiprocessing.spawn's children are the ranks (their parent never imports the model):
    local rank 0 of them prints, rank 1 does not."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED_RANKS)
    proc = subprocess.run([sys.executable, str(script)], env=env_for(tmp_path), capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    said = human(proc.stderr)
    assert len(said) == 1 and "no CUDA/XPU accelerator" in said[0], said


# -- a repeating skip is said once per environment -----------------------------------------------

def test_a_repeating_skip_is_said_once_per_environment_then_at_debug(tmp_path):
    env = env_for(tmp_path)
    first = run(env)
    assert len(first) == 1 and "no CUDA/XPU accelerator" in first[0], first
    assert run(env) == []
    again = run(dict(env, FASTPATH_HOOKS_LOG="debug"))
    assert any("no CUDA/XPU accelerator" in line and "said before" in line for line in again), again
    # a different decision is new: said once
    other = run(dict(env, FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_MODE="report"))
    assert any("would install" in line for line in other), other
    assert run(dict(env, FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_MODE="report")) == []
    # `doctor --refresh` forgets what was said
    subprocess.run([sys.executable, "-m", "fastpath_hooks", "doctor", "--refresh"], env=env, check=True,
                   capture_output=True)
    assert run(env) == first


# -- download --dest ---------------------------------------------------------------------------

def test_download_dest_errors_are_one_line_exit_2(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = {"a file": str(a_file), "under a file": str(a_file / "wheels"), "on /proc": "/proc/fastpath-wheels",
             "name too long": str(tmp_path / ("w" * 300))}
    for name, dest in cases.items():
        proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "download", "--dest", dest, "--target", A100],
                              env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", (name, proc.stdout, proc.stderr)
        assert lines[0].startswith("fastpath-hooks: --dest ") and len(lines[0]) <= MAX, (name, lines)
        assert ("is a file" if name == "a file" else "cannot write there") in lines[0], (name, lines)
    assert a_file.read_text() == "x" and not os.path.exists("/proc/fastpath-wheels")


# -- no installer: a `uv venv` (no pip) without uv on PATH ---------------------------------------

CAUSAL = "import importlib.util, fastpath_hooks\nfastpath_hooks.install()\nimportlib.util.find_spec('causal_conv1d')\n" \
         "from fastpath_hooks import engine\nprint(engine.outcomes()['causal-conv1d'].state)"


@pytest.mark.slow
def test_a_uv_venv_without_pip_names_the_fix_and_a_fix_takes_effect_at_once(tmp_path, torch_wheel, fastpath_wheel,
                                                                             make_wheelhouse, test_pins):
    venv = venvs.make_venv(str(tmp_path / "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                           transformers=None, seed=False)
    assert not os.path.exists(os.path.join(venv.bin, "pip")) and not os.path.exists(os.path.join(venv.bin, "uv"))
    wheelhouse = make_wheelhouse(causal=True, deps=False)
    env = guarded.kernel_env(target=A100, cache_dir=str(tmp_path / "cache"), wheelhouse=wheelhouse,
                             pins=test_pins(wheelhouse))
    doctor = venv.cli("doctor", env=env)
    assert doctor.returncode == 0, doctor.stderr
    (row,) = [line for line in doctor.stdout.splitlines() if line.strip().startswith("installer")]
    assert "none - no installer" in row and "uv on PATH" in row and "ensurepip" in row, row
    assert "FASTPATH_HOOKS_INSTALLER=uv" in row
    (summary,) = [line for line in doctor.stdout.splitlines() if line.startswith("Summary:")]
    assert "but cannot: no installer" in summary, summary
    assert "install()      install" not in doctor.stdout     # no promise
    plan = venv.cli("plan", env=env)
    assert plan.stdout.startswith("installer: none - no installer"), plan.stdout

    first = venv.run(CAUSAL, env=env)
    assert first.stdout.strip() == "failed", first.stderr
    (line,) = [ln for ln in human(first.stderr) if not ln.startswith("fastpath-hooks: posing ")]   # the target's own
    assert "causal-conv1d: not installed - no installer" in line and "ensurepip" in line, line
    assert not os.path.exists(os.path.join(venv.site, "causal_conv1d"))

    # the fix (uv on PATH) works at the next start: no "earlier attempt failed" memory in the way
    fixed_env = guarded.kernel_env(target=A100, cache_dir=str(tmp_path / "cache"), wheelhouse=wheelhouse,
                                   pins=test_pins(wheelhouse), uv=guarded.uv_dir(str(tmp_path)))
    fixed = venv.run(CAUSAL, env=fixed_env)
    assert fixed.stdout.strip() == "installed", fixed.stderr
    assert any("installed causal-conv1d" in line and "with uv" in line for line in human(fixed.stderr)), fixed.stderr

    # FASTPATH_HOOKS_INSTALLER=pip where there is none: doctor says so and names the fix
    pip_env = dict(env, FASTPATH_HOOKS_INSTALLER="pip")
    doctor = venv.cli("doctor", env=pip_env)
    (row,) = [line for line in doctor.stdout.splitlines() if line.strip().startswith("installer")]
    assert "none - FASTPATH_HOOKS_INSTALLER=pip but no pip here" in row and "ensurepip" in row, row
