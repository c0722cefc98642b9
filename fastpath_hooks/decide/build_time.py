"""How long a compiled kernel's source build takes and how it uses the machine: the estimate (this
machine's own last build, else the pins' measured figure, scaled by archs and cores), each build's
share of the cores (MAX_JOBS and nvcc --split-compile threads, within the memory) when several run at
once, and a duration as the lines say it.
"""

from __future__ import annotations

from typing import NamedTuple

from packaging.specifiers import SpecifierSet

from .common import within


def build_estimate(build, n_archs: int, cpus: int | None, history=()) -> tuple:
    """(seconds, how): a measured build scaled by archs (each is compiled separately) and by fewer
    cores (more cores do not help: the big files compile one per job). The measurement is this
    machine's own last build of the distribution (`history`: the probe's `build_history`, newest
    last; the same version preferred) where there is one, else the pins' `measured` figure."""
    mine = [r for r in history if r.get("distribution") == build.distribution and r.get("seconds")]
    same = [r for r in mine if r.get("version") == build.version] or mine
    if same:
        rec = same[-1]
        base, archs, cores = float(rec["seconds"]), max(1, int(rec.get("n_archs") or 1)), max(1, int(rec.get("cores") or 1))
        split = int(rec.get("split") or 1)
        origin = (f"this machine's build of {build.distribution} {rec.get('version')} took {base:.0f} s for {archs} arch "
                  f"on {cores} cores" + (f" (--split-compile={split})" if split > 1 else ""))
    else:
        base, archs, cores = build.seconds, build.archs, build.cores
        origin = f"{build.seconds:.0f} s measured for {build.archs} arch on {build.cores} cores"
    seconds = base * n_archs / archs
    if cpus and cpus < cores:
        seconds *= cores / cpus
    how = f"an estimate: {origin}, scaled to {n_archs} arch{'s' if n_archs != 1 else ''} on {cpus or '?'} cores"
    return seconds, how


# -- how a build uses the machine: jobs, split compilation, the share of the cores -------------------

# nvcc --split-compile=N (CUDA 11.8+: "Improving CUDA Compilation Time" in the CUDA Programming Guide;
# `nvcc --help` of 13.0) runs the optimizer (cicc) and ptxas of one translation unit in N threads.
SPLIT_COMPILE_NVCC = ">=11.8"
# A job's memory: 4-6 GB resident measured for one causal-conv1d nvcc job with `--threads 4` (four
# compiler threads, gpu-findings.md): about 1.5 GB per compiler thread, a job counted as its threads.
GIB_PER_THREAD = 1.5


class Share(NamedTuple):
    """One build's part of the machine: `cores` of its CPUs, MAX_JOBS=`jobs`, `split` threads per nvcc job
    (1: no --split-compile) - jobs x split <= cores, and within its part of the memory; `parts`: how many
    parts a file of the pins' `split_units` is compiled in, side by side (1: whole)."""
    cores: int
    jobs: int
    split: int
    parts: int = 1


def unit_parts(build, cores: int) -> int:
    """The parts a split unit is compiled in with `cores`: the cores the build's other files leave."""
    if not build.split_units:
        return 1
    units = max(int(build.translation_units or 1), len(build.unit_seconds))
    return max(1, cores - (units - len(build.split_units)))


def makespan(build, cores: int) -> float | None:
    """The build's expected wall time on `cores` from its files' measured compiles (pins
    `parallel.unit_seconds`; a split unit in `unit_parts` equal parts), longest first onto the least
    loaded core; None without the figures."""
    seconds = dict(build.unit_seconds)
    if not seconds:
        return None
    parts = unit_parts(build, cores)
    pieces = [s for u, s in seconds.items() if u not in build.split_units]
    pieces += [seconds[u] / parts for u in build.split_units for _ in range(parts)]
    loads = [0.0] * max(1, cores)
    for piece in sorted(pieces, reverse=True):
        loads[loads.index(min(loads))] += piece
    return max(loads)


def split_allowed(build, settings, nvcc_version) -> bool:
    """--split-compile for this build: the pins allow it for the kernel, FASTPATH_HOOKS_SPLIT_COMPILE is
    not 0, and nvcc is a release that has it (an unknown release: not given)."""
    if getattr(settings, "split_compile", "auto") == "0" or not build.split_compile or nvcc_version is None:
        return False
    return within(nvcc_version, SpecifierSet(SPLIT_COMPILE_NVCC))


def core_budget(builds, *, cpus: int | None, memory_gib: float | None, settings=None, jobs_given: int | None = None) -> dict:
    """kernel -> Share for builds that run at the same time: `builds` = (kernel, SourceBuild,
    expected seconds, split allowed). The cores go where they shorten the longest build (`_balanced`,
    from the files' measured compiles) - else in proportion to the expected times - at least one each; within its share a build runs one job per
    translation unit (more leave cores idle) and gives nvcc the cores left over as --split-compile
    threads; memory (`GIB_PER_THREAD` per thread, in the same proportion) takes threads away first,
    then jobs. `jobs_given`: the user's MAX_JOBS, kept as it is. FASTPATH_HOOKS_SPLIT_COMPILE=N sets N."""
    builds = list(builds)
    if not builds:
        return {}
    total = max(1, cpus or 1)
    if len(builds) > 1 and all(b.unit_seconds for _, b, _, _ in builds):
        shares = _balanced(total, [b for _, b, _, _ in builds])
    else:
        weights = [max(1.0, float(seconds or 1.0)) for _, _, seconds, _ in builds]
        shares = _proportional(total, weights)
    forced = getattr(settings, "split_compile", "auto")
    out = {}
    for (kernel, build, _, allowed), cores in zip(builds, shares):
        units = max(1, int(getattr(build, "translation_units", 1) or 1))
        if jobs_given:
            jobs = jobs_given
        elif allowed and forced not in ("auto", "0"):
            jobs = max(1, min(units, cores // int(forced)))
        else:
            jobs = min(units, cores)
        split = 1
        if allowed:
            split = int(forced) if forced not in ("auto", "0") else max(1, cores // jobs)
        parts = unit_parts(build, cores) if allowed else 1
        if jobs_given:
            parts = min(parts, jobs_given)   # the user's MAX_JOBS caps the compiles at once, parts too
        if memory_gib:
            room = memory_gib * cores / total
            while split > 1 and jobs * split * GIB_PER_THREAD > room:
                split -= 1
            while parts > 1 and (jobs - 1 + parts) * GIB_PER_THREAD > room:
                parts -= 1
            while not jobs_given and jobs > 1 and jobs * GIB_PER_THREAD > room:
                jobs -= 1
        out[kernel] = Share(cores, jobs, split, parts)
    return out


def _balanced(total: int, builds) -> list:
    """`total` cores for builds that run side by side, one at a time to the build whose expected wall
    time (`makespan`) is longest and drops with it - the request is done when its longest build is."""
    shares = [1] * len(builds)
    for _ in range(max(0, total - len(builds))):
        spans = [makespan(b, c) for b, c in zip(builds, shares)]
        order = sorted(range(len(builds)), key=lambda i: spans[i], reverse=True)
        pick = next((i for i in order if makespan(builds[i], shares[i] + 1) < spans[i] - 1e-9), order[0])
        shares[pick] += 1
    return shares


def _proportional(total: int, weights) -> list:
    """`total` whole cores split in proportion to `weights`, at least one each (largest remainders)."""
    n = len(weights)
    if total <= n:
        return [1] * n
    spare = total - n
    raw = [spare * w / sum(weights) for w in weights]
    shares = [1 + int(r) for r in raw]
    left = total - sum(shares)
    for i in sorted(range(n), key=lambda i: raw[i] - int(raw[i]), reverse=True)[:left]:
        shares[i] += 1
    return shares


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
