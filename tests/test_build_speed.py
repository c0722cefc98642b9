"""Faster builds and the honest wait, part by part (fast): how a build's share of the machine is cut
(jobs by translation units, --split-compile threads from the cores left over, memory, several builds
side by side), the estimate from this machine's own builds, the nvcc speed wrapper run for real
(the fake toolkit's nvcc behind it, a stand-in ccache in front of that), the heartbeat, one
verification child for several kernels. The whole path in real venvs: tests/test_speed.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from support import sdists
from fastpath_hooks.act import build as nvcc_speed
from fastpath_hooks.act.runner import _elapsed
from fastpath_hooks.act.verify import verify_many
from fastpath_hooks.decide.builds import Share, build_estimate, core_budget, minutes, split_allowed
from fastpath_hooks.facts import memory, pins as pins_mod
from fastpath_hooks.facts.settings import Settings

PINS = pins_mod.load()
CONV = PINS.build("causal-conv1d")     # 4 translation units, its measured build for sm_90 on 16 cores
MAMBA = PINS.build("mamba-ssm")        # 10 translation units, 117 s


def _nvcc_wrapper(work, nvcc, keep, speed):
    return nvcc_speed.write_wrapper(work, "nvcc-restricted", real=[nvcc], kind="nvcc", keep=keep, speed=speed)


def _budget(*builds, cpus=16, memory=128.0, settings=None, jobs_given=None):
    return core_budget([(k, b, s, ok) for k, b, s, ok in builds], cpus=cpus, memory_gib=memory,
                       settings=settings or Settings(), jobs_given=jobs_given)


def test_the_pins_say_how_many_files_each_build_compiles_and_that_split_compilation_may_be_used():
    assert (CONV.translation_units, CONV.split_compile) == (4, True)
    assert (MAMBA.translation_units, MAMBA.split_compile) == (10, True)
    assert PINS.build("mamba-ssm", "2.3.1").translation_units == 10   # another pinned release keeps them


@pytest.mark.parametrize("builds,cpus,memory,expected", [
    # alone on the H200's 16 cores: one job per file, the cores left over as split threads, and the
    # backward file (pins split_units) in as many parts as the other three files leave cores
    ((("causal-conv1d", CONV, 275, True),), 16, 128.0, {"causal-conv1d": Share(16, 4, 4, 13)}),
    ((("mamba-ssm", MAMBA, 117, True),), 16, 128.0, {"mamba-ssm": Share(16, 10, 1)}),
    # side by side: the cores go where they shorten the longer build (the files' measured compiles):
    # mamba-ssm's slowest file bounds it from 7 cores on, the other 9 cut causal-conv1d's backward in 6
    ((("causal-conv1d", CONV, 275, True), ("mamba-ssm", MAMBA, 117, True)), 16, 128.0,
     {"causal-conv1d": Share(9, 4, 2, 6), "mamba-ssm": Share(7, 7, 1)}),
    # an nvcc without --split-compile (or the switch off): one thread per job and no parts
    ((("causal-conv1d", CONV, 275, False),), 16, 128.0, {"causal-conv1d": Share(16, 4, 1)}),
    # memory: 6 GiB holds four 1.5 GiB compiler threads - the split threads and the parts go first
    ((("causal-conv1d", CONV, 275, True),), 16, 6.0, {"causal-conv1d": Share(16, 4, 1)}),
    ((("causal-conv1d", CONV, 275, True),), 16, 3.0, {"causal-conv1d": Share(16, 2, 1)}),
    # two cores, two builds: one each (never zero), nothing in parts
    ((("causal-conv1d", CONV, 275, True), ("mamba-ssm", MAMBA, 117, True)), 2, 64.0,
     {"causal-conv1d": Share(1, 1, 1), "mamba-ssm": Share(1, 1, 1)}),
])
def test_core_budget(builds, cpus, memory, expected):
    got = _budget(*builds, cpus=cpus, memory=memory)
    assert got == expected
    for kernel, share in got.items():   # never more threads than the build's cores (bar the one-core floor)
        assert share.jobs * share.split <= max(share.cores, 1)
        assert share.jobs - 1 + share.parts <= max(share.cores, 1)


def test_side_by_side_the_balanced_cores_finish_the_request_sooner_than_a_proportional_cut():
    """The request is done when its longest build is: from the files' measured compiles, the balanced
    cut (9 + 7) is expected to end with mamba-ssm's slowest file, the old proportional one (11 + 5) with
    mamba-ssm's five jobs; more cores than 7 do not shorten mamba-ssm at all."""
    from fastpath_hooks.decide.builds import makespan

    got = _budget(("causal-conv1d", CONV, 275, True), ("mamba-ssm", MAMBA, 117, True))
    balanced = max(makespan(CONV, got["causal-conv1d"].cores), makespan(MAMBA, got["mamba-ssm"].cores))
    proportional = max(makespan(CONV, 11), makespan(MAMBA, 5))
    assert balanced == max(dict(MAMBA.unit_seconds).values()) < proportional
    assert makespan(MAMBA, 16) == makespan(MAMBA, 7) < makespan(MAMBA, 6)
    # causal-conv1d's backward is most of its build: whole, it alone sets the wall time
    assert makespan(dataclasses.replace(CONV, split_units=()), 16) == dict(CONV.unit_seconds)["causal_conv1d_bwd.cu"]
    assert makespan(CONV, 9) < makespan(CONV, 4) / 4
    # without the figures for every build of the request: the old proportional cut
    bare = dataclasses.replace(MAMBA, unit_seconds=())
    assert _budget(("causal-conv1d", CONV, 275, True), ("mamba-ssm", bare, 117, True))["mamba-ssm"].cores == 5


def test_core_budget_keeps_the_users_max_jobs_and_a_forced_split():
    # MAX_JOBS caps the compiles at once: the parts too
    assert _budget(("causal-conv1d", CONV, 275, True), jobs_given=2) == {"causal-conv1d": Share(16, 2, 8, 2)}
    forced = Settings(split_compile="3")
    assert _budget(("causal-conv1d", CONV, 275, True), settings=forced) == {"causal-conv1d": Share(16, 4, 3, 13)}
    assert _budget(("mamba-ssm", MAMBA, 117, True), settings=forced) == {"mamba-ssm": Share(16, 5, 3)}


def test_split_compile_needs_nvcc_11_8_the_pins_and_the_setting():
    assert split_allowed(CONV, Settings(), "13.0") and split_allowed(CONV, Settings(), "11.8")
    assert not split_allowed(CONV, Settings(), "11.7")
    assert not split_allowed(CONV, Settings(), None)                      # an nvcc of unknown release
    assert not split_allowed(CONV, Settings(split_compile="0"), "13.0")  # the A/B switch
    assert not split_allowed(dataclasses.replace(CONV, split_compile=False), Settings(), "13.0")   # the pins' switch


def test_the_estimate_is_this_machines_last_build_of_it_else_the_pins_figure():
    seconds, how = build_estimate(CONV, 1, 16)
    assert seconds == CONV.seconds and f"{CONV.seconds:.0f} s measured for 1 arch on 16 cores" in how
    history = ({"distribution": "causal-conv1d", "version": "1.6.2.post1", "n_archs": 1, "cores": 16, "split": 4,
                "seconds": 141.0},
               {"distribution": "mamba-ssm", "version": "2.3.2.post1", "n_archs": 1, "cores": 5, "seconds": 90.0},
               {"distribution": "causal-conv1d", "version": "1.7.0", "n_archs": 1, "cores": 16, "seconds": 99.0})
    seconds, how = build_estimate(CONV, 2, 8, history)       # the same version's, not the newer 1.7.0 one
    assert seconds == 141.0 * 2 * 2 and "this machine's build of causal-conv1d 1.6.2.post1 took 141 s" in how
    assert "--split-compile=4" in how and "scaled to 2 archs on 8 cores" in how
    seconds, _ = build_estimate(MAMBA, 1, 16, history)       # built with 5 cores: more do not make it slower
    assert seconds == 90.0


def test_the_build_history_keeps_this_hosts_records(tmp_path):
    path = memory.builds_path(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write(json.dumps({"distribution": "causal-conv1d", "seconds": 100, "host": "elsewhere"}) + "\n")
        fh.write("not json\n")
        fh.write(json.dumps({"distribution": "causal-conv1d", "seconds": 120, "host": memory.host(),
                             "unknown": 1}) + "\n")
    assert memory.read_builds(str(tmp_path)) == ({"distribution": "causal-conv1d", "seconds": 120,
                                                  "host": memory.host()},)
    assert memory.read_builds(None) == () and memory.read_builds(str(tmp_path / "none")) == ()


def test_the_heartbeat_says_elapsed_of_expected():
    assert _elapsed(95, None) == "95 s"
    assert _elapsed(95, 270) == "95 s of about 270 s expected"
    assert _elapsed(300, 270) == "300 s, over the 270 s expected"
    assert minutes(270) == "4 min"


# -- the nvcc speed wrapper, for real --------------------------------------------------------------

def _compile(wrapper, source, obj, env):
    return subprocess.run([wrapper, "-c", source, "-o", obj, "-O3", "-gencode", "arch=compute_90,code=sm_90",
                           "-gencode", "arch=compute_80,code=sm_80"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_wrapper_adds_split_compile_records_each_compile_and_runs_ccache_in_front(tmp_path, toolkit):
    work = str(tmp_path / "work")
    os.makedirs(work)
    source = str(tmp_path / "causal_conv1d_bwd.cu")
    with open(source, "w") as fh:
        fh.write("__global__ void k() {}\n")
    launcher_dir = str(tmp_path / "tools")
    sdists.fake_ccache(launcher_dir)
    speed = nvcc_speed.plan(work, split=4, path_var=launcher_dir + os.pathsep + os.environ["PATH"])
    assert speed.launcher == os.path.join(launcher_dir, "ccache") and speed.split == 4
    wrapper = _nvcc_wrapper(work, toolkit.nvcc, ["sm_90"], speed=speed)    # the build's one nvcc wrapper
    env = dict(os.environ, **nvcc_speed.launcher_environ(speed, work))
    assert env["CCACHE_BASEDIR"] == work and env["CCACHE_STATSLOG"].startswith(work)

    first = _compile(wrapper, source, str(tmp_path / "a.o"), env)
    second = _compile(wrapper, source, str(tmp_path / "a.o"), env)   # the same compile again
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert nvcc_speed.SPEED_MARK in first.stderr and "--split-compile=4" in first.stderr and "ccache" in first.stderr
    assert "fastpath-hooks nvcc wrapper: kept arch=compute_90,code=sm_90; dropped arch=compute_80" in first.stderr
    # the real (fake) nvcc ran once, with the split added once; the second compile was ccache's hit
    (call,) = toolkit.calls()
    assert call.count("--split-compile=4") == 1 and sdists.gencode_codes(call) == ["sm_90"]
    assert open(tmp_path / "a.o").read() == "fake object\n"
    assert nvcc_speed.ccache_result(work) == {"hits": 1, "misses": 1, "uncacheable": 0}
    records = nvcc_speed.calls(speed)
    assert [r["source"] for r in records] == [source, source] and all(r["split"] == 4 for r in records)
    assert all(r["launcher"] == "ccache" and r["code"] == 0 and r["seconds"] >= 0 for r in records)
    line, info = nvcc_speed.summary(speed, work)
    assert line.startswith("2 nvcc compiles, --split-compile=4, slowest causal_conv1d_bwd.cu ")
    assert line.endswith("ccache: 1 hit, 1 miss") and info["cache"]["hits"] == 1


def test_one_wrapper_restricts_the_archs_adds_the_split_and_keeps_the_standard_last():
    """The speed part lives in the same rewrite as the arch and C++-standard rules (act/compiler_wrapper.py):
    the split goes on a compile only, once, and the rule's -std stays the last argument."""
    from fastpath_hooks.act.compiler_wrapper import rewrite

    argv = ["-c", "x.cu", "-o", "x.o", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90",
            "-gencode", "arch=compute_100,code=sm_100"]
    out, said = rewrite(argv, {"kind": "nvcc", "keep": ["sm_90"], "std": "c++20", "split": 4})
    assert out == ["-c", "x.cu", "-o", "x.o", "-gencode", "arch=compute_90,code=sm_90", "--split-compile=4",
                   "-std=c++20"]
    assert said[0] == ("fastpath-hooks nvcc wrapper: kept arch=compute_90,code=sm_90; dropped "
                       "arch=compute_100,code=sm_100")
    assert rewrite(["-E", "x.cu"], {"kind": "nvcc", "keep": None, "std": None, "split": 4})[0] == ["-E", "x.cu"]
    assert rewrite(["-c", "x.cpp"], {"kind": "cxx", "keep": None, "std": None, "split": 4})[0] == ["-c", "x.cpp"]


def test_the_wrapper_keeps_a_split_the_build_gives_and_passes_version_queries(tmp_path, toolkit):
    work = str(tmp_path / "work")
    os.makedirs(work)
    speed = nvcc_speed.plan(work, split=8, path_var="/nonexistent")
    assert speed.launcher is None
    wrapper = _nvcc_wrapper(work, toolkit.nvcc, None, speed=speed)
    out = subprocess.run([wrapper, "--version"], capture_output=True, text=True, timeout=60)
    assert "release 13.0" in out.stdout and not nvcc_speed.calls(speed)     # not a compile: nothing recorded
    source = str(tmp_path / "x.cu")
    open(source, "w").close()
    done = subprocess.run([wrapper, "-c", source, "-o", str(tmp_path / "x.o"), "--split-compile=2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    (call,) = toolkit.calls()
    assert [a for a in call if "split-compile" in a] == ["--split-compile=2"]   # the build's own, not a second one
    line, info = nvcc_speed.summary(speed, work)
    assert "no compiler cache" in line and info["launcher"] is None
    toolkit.fail()
    failed = subprocess.run([wrapper, "-c", source, "-o", str(tmp_path / "y.o")], capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode == 1 and "error: identifier" in failed.stderr    # nvcc's exit status and message pass through
    assert nvcc_speed.calls(speed)[-1]["code"] == 1


def test_without_a_split_the_wrapper_adds_none(tmp_path, toolkit):
    work = str(tmp_path / "work")
    os.makedirs(work)
    wrapper = _nvcc_wrapper(work, toolkit.nvcc, None, speed=nvcc_speed.plan(work, split=1, path_var="/nonexistent"))
    source = str(tmp_path / "x.cu")
    open(source, "w").close()
    assert subprocess.run([wrapper, "-c", source, "-o", str(tmp_path / "x.o")], timeout=60).returncode == 0
    assert not [a for a in toolkit.calls()[0] if "split-compile" in a]


# -- a file in parts: its explicit instantiations compiled side by side, linked back into one object ----

_TEMPLATED = """#include "twice.h"
template<typename T, int N>
T scale(T x) { return twice(x) * N; }
template<typename T>
T scale_all(T x) { return scale<T, 2>(x) + scale<T, 3>(x); }

template int scale_all<int>(int x);
template long scale_all<long>(long x);
template double scale_all<double>(double x);
template float scale_all<float>(float x);
template short scale_all<short>(short x);
"""
_DRIVER = """#include <cstdio>
template<typename T> T scale_all(T x);
int main() { std::printf("%d %ld %g %g %d\\n", scale_all<int>(1), scale_all<long>(2), scale_all<double>(0.5),
                         scale_all<float>(1.0f), (int)scale_all<short>(3)); return 0; }
"""
# nvcc as far as these files need one: g++ compiles them (-gencode and the like ignored), each call recorded
_GXX_NVCC = """#!PYTHON
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(args) + "\\n")
src = next(a for a in args if a.endswith(".cu"))
cmd = ["g++", "-x", "c++", "-c", src, "-o", args[args.index("-o") + 1]]
if "--dependency-output" in args:
    cmd += ["-MD", "-MF", args[args.index("--dependency-output") + 1]]
sys.exit(subprocess.call(cmd))
"""


def _parted_build(tmp_path, parts, **config):
    from fastpath_hooks.act.build import write_wrapper

    src_dir, bin_dir, work = tmp_path / "csrc", tmp_path / "bin", tmp_path / "work"
    for d in (src_dir, bin_dir, work):
        d.mkdir()
    (src_dir / "twice.h").write_text("template<typename T> T twice(T x) { return x + x; }\n")
    (src_dir / "scale.cu").write_text(_TEMPLATED)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(_GXX_NVCC.replace("PYTHON", sys.executable))
    nvcc.chmod(0o755)
    speed = nvcc_speed.plan(str(work), split=2, path_var="/nonexistent", parts=[("scale.cu", parts)])
    wrapper = write_wrapper(str(work), "nvcc-wrapped", real=[str(nvcc)], kind="nvcc", speed=speed)
    if config:
        cfg = str(work / "nvcc-wrapped.json")
        json.dump(dict(json.load(open(cfg)), **config), open(cfg, "w"))
    obj = str(tmp_path / "scale.o")
    done = subprocess.run([wrapper, "-c", str(src_dir / "scale.cu"), "-o", obj, "-gencode", "arch=compute_90,code=sm_90",
                           "--generate-dependencies-with-compile", "--dependency-output", obj + ".d"],
                          capture_output=True, text=True, timeout=120)
    calls = [json.loads(line) for line in open(bin_dir / "calls.jsonl")]
    return done, calls, obj, speed, src_dir


def _run_linked(tmp_path, obj) -> str:
    driver = tmp_path / "driver.cpp"
    driver.write_text(_DRIVER)
    exe = str(tmp_path / "driver")
    subprocess.run(["g++", str(driver), obj, "-o", exe], check=True, timeout=120)
    return subprocess.run([exe], capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_a_split_unit_compiles_as_parts_side_by_side_and_links_back_into_the_one_object(tmp_path):
    done, calls, obj, speed, src_dir = _parted_build(tmp_path, 3)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 3                                        # three compiles, one per part
    parts = [next(a for a in c if a.endswith(".cu")) for c in calls]
    assert sorted(os.path.basename(p) for p in parts) == [f"scale.fph-part{k}.cu" for k in range(3)]
    assert all(os.path.dirname(p) == str(src_dir) for p in parts)   # beside it: its #include "twice.h" resolves
    assert not any("split-compile" in a for c in calls for a in c)  # the parts are the threads
    assert sorted(os.listdir(src_dir)) == ["scale.cu", "twice.h"]   # the parts are gone again
    # every instantiation is in the one object, once, and a program linked with it runs them all
    assert _run_linked(tmp_path, obj) == "10 20 5 10 30"
    # the dependency file is the one ninja asked for, naming the object and the real file
    deps = open(obj + ".d").read()
    assert deps.startswith(obj + ":") and str(src_dir / "scale.cu") in deps and "twice.h" in deps
    assert "fph-part" not in deps
    (record,) = nvcc_speed.calls(speed)
    assert record["parts"] == 3 and record["code"] == 0 and record["source"].endswith("scale.cu")
    assert "(3 parts side by side), exit 0" in done.stderr


def test_a_part_that_cannot_be_linked_back_leaves_the_file_compiled_whole(tmp_path):
    done, calls, obj, _, src_dir = _parted_build(tmp_path, 8, ld="false")   # the link back fails
    assert done.returncode == 0, done.stderr
    assert len(calls) == 5 + 1           # at most one part per instantiation, then the whole file
    assert next(a for a in calls[-1] if a.endswith(".cu")) == str(src_dir / "scale.cu")
    assert "compiling it whole instead" in done.stderr
    assert _run_linked(tmp_path, obj) == "10 20 5 10 30"
    assert sorted(os.listdir(src_dir)) == ["scale.cu", "twice.h"]


def test_split_source_keeps_every_line_but_a_share_of_the_explicit_instantiations():
    from fastpath_hooks.act.compiler_wrapper import split_source

    texts = split_source(_TEMPLATED, 2)
    assert len(texts) == 2 and all(t.count("\n") == _TEMPLATED.count("\n") for t in texts)   # line numbers stay
    kept = [[ln for ln in t.splitlines() if ln.startswith("template ")] for t in texts]
    assert kept == [["template int scale_all<int>(int x);", "template double scale_all<double>(double x);",
                     "template short scale_all<short>(short x);"],
                    ["template long scale_all<long>(long x);", "template float scale_all<float>(float x);"]]
    assert all("template<typename T>" in t for t in texts)       # the templates themselves stay in every part
    assert split_source("template void f<int>(int);\nint g() { return 1; }\n", 4) == []   # one: nothing to split


# -- one verification child for several kernels ---------------------------------------------------

class _Spec:
    def __init__(self, modules, attributes=()):
        self.verify_modules, self.verify_attributes = tuple(modules), tuple(attributes)


def test_one_child_checks_several_kernels_and_a_crash_blames_only_the_kernel_it_happened_in(tmp_path):
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / "good_one.py").write_text("def fn():\n    return 1\n")
    (pkg / "crashes.py").write_text("import os\nos.abort()\n")
    (pkg / "good_two.py").write_text("VALUE = 2\n")
    env = (("PYTHONPATH", str(pkg)),)
    results = verify_many([_Spec(["good_one"], ["good_one:fn"]), _Spec(["good_two"]), _Spec(["json"], ["json:dumps"])],
                          timeout=60, env_extra=env)
    assert [r.ok for r in results] == [True, True, True]
    assert all("one check for 3 kernels" in r.detail for r in results)
    results = verify_many([_Spec(["good_one"]), _Spec(["crashes"]), _Spec(["good_two"])], timeout=60, env_extra=env)
    assert [r.ok for r in results] == [True, False, False]
    assert "killed the process (SIGABRT)" in results[1].detail and results[1].detail.startswith("import crashes")
    assert results[2].detail.startswith("not checked")      # never reached: not to be blamed
    results = verify_many([_Spec(["good_one"], ["good_one:VALUE_MISSING"]), _Spec(["good_two"], ["good_two:VALUE"])],
                          timeout=60, env_extra=env)
    assert not results[0].ok and "AttributeError" in results[0].detail
    assert not results[1].ok and "not callable" in results[1].detail


def test_a_sys_executable_child_is_what_checks(tmp_path):
    """The batch check runs this interpreter, as the one-kernel check does (the venv's python)."""
    (tmp_path / "where.py").write_text(f"import sys\nassert sys.executable == {sys.executable!r}\n")
    (result,) = verify_many([_Spec(["where"])], timeout=60, env_extra=(("PYTHONPATH", str(tmp_path)),))
    assert result.ok, result.detail


class _Kernel(_Spec):
    def __init__(self, name, modules, distributions):
        super().__init__(modules)
        self.name, self.distributions = name, tuple(distributions)


def _installed(site, name, version, body):
    """A module and its distribution's dist-info (RECORD with the module's sha256), as a wheel leaves them."""
    import base64
    import hashlib

    (site / f"{name}.py").write_text(body)
    digest = base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{name}.py,sha256={digest},{len(body)}\n{name}-{version}.dist-info/RECORD,,\n")


def test_an_import_remembered_for_exactly_this_environment_starts_no_child(tmp_path, monkeypatch):
    """The lighter check of a later environment (act/store.py): the same installed files beside
    the same versions of what their import loads are not imported again in a child; another version of
    a loaded distribution, other kernel files, or a failed import - and the child runs."""
    site, root, seen = tmp_path / "site", str(tmp_path / "cache"), tmp_path / "imports.log"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))      # the environment whose distributions the key lists
    counting = f"with open({str(seen)!r}, 'a') as fh:\n    fh.write('x')\n"
    _installed(site, "kern_a", "1.0", counting + "def fn():\n    return 1\n")
    _installed(site, "kern_b", "2.0", "import kern_a\n")
    specs = [_Kernel("kern-a", ["kern_a"], ["kern-a"]), _Kernel("kern-b", ["kern_b"], ["kern-b"])]
    env = (("PYTHONPATH", str(site)), ("TMPDIR", str(tmp_path / "scratch-1")))

    def check(env=env):
        before = seen.read_text() if seen.exists() else ""
        results = verify_many(specs, timeout=60, env_extra=env, root=root)
        return [r.ok for r in results], [r.detail for r in results], len(seen.read_text()) - len(before)

    assert check()[::2] == ([True, True], 1)                         # the first time: one child imported them
    oks, details, children = check((("PYTHONPATH", str(site)), ("TMPDIR", str(tmp_path / "scratch-2"))))
    assert (oks, children) == ([True, True], 0)                      # another install's scratch dir: remembered
    assert all("remembered (same files and environment" in d for d in details), details
    _installed(site, "newcomer", "0.1", "")            # one the imports do not load (a build's ninja): no matter
    assert check()[::2] == ([True, True], 0)
    info = next(site.glob("kern_a-*.dist-info"))        # another version of what kern_b loads: checked again
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kern_a\nVersion: 1.1\n")
    info.rename(site / "kern_a-1.1.dist-info")
    assert check()[::2] == ([True, True], 1) and check()[::2] == ([True, True], 0)
    (site / "kern_b.py").write_text("import kern_a\nraise ImportError('kern_b broke')\n")   # not its wheel's file
    for info in site.glob("kern_b-*.dist-info"):
        (info / "RECORD").write_text("kern_b.py,sha256=changed,1\n")
    oks, details, children = check()
    assert oks == [True, False] and "kern_b broke" in details[1] and children == 1
    assert check()[0] == [True, False]                               # a failure is never remembered
    assert sorted(os.listdir(os.path.join(root, "verified"))) == ["kern-a.json", "kern-a.json.lock",
                                                                  "kern-b.json", "kern-b.json.lock"]


# -- the request: what the modeling module being imported will ask for -----------------------------

def test_while_granite_4_0_h_is_imported_its_first_kernel_import_sees_both_kernels_coming():
    """transformers >= 5.15 imports causal_conv1d at the first decorator of modeling_granitemoehybrid,
    mamba_ssm only at a later one: the hint (read when the first is about to be installed) names
    both, so they build side by side (real transformers, its real modeling module)."""
    import importlib

    from fastpath_hooks.hooks.gates import modeling_kernels

    seen = {}

    class Spy:
        def find_spec(self, name, path=None, target=None):
            if name in ("causal_conv1d", "mamba_ssm") and name not in seen:
                seen[name] = modeling_kernels()
            return None

    name = "transformers.models.granitemoehybrid.modeling_granitemoehybrid"
    saved = {k: v for k, v in sys.modules.items() if k == name}
    sys.modules.pop(name, None)
    spy = Spy()
    sys.meta_path.insert(0, spy)
    try:
        importlib.import_module(name)
    finally:
        sys.meta_path.remove(spy)
        sys.modules.pop(name, None)
        sys.modules.update(saved)
    assert seen.get("causal_conv1d") == {"causal-conv1d", "mamba-ssm"}, seen
    assert modeling_kernels() == set()     # nothing is being imported now
