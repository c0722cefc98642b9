"""Validation of the rules the pins hold as data (docs/builds.md), for facts/pins_schema.py and
pins_kernels.py: a compiled kernel's release wheels and source build (its -gencode table, its opt-in
CUDA extension), its arch rules, the C++ standard a torch needs, every kind's numeric checks and a
release's known issues. Each function takes the pins validator `v` (facts/pins_validator.py: errors
name the file and the entry)."""

from __future__ import annotations

from packaging.requirements import Requirement

from .pins_values import ArchRule, CudaSwitch, CxxStandard, NumericCheck, ReleaseIssue, ReleaseWheels, SourceBuild

STDS = ("c++17", "c++20", "c++23", "gnu++17", "gnu++20", "gnu++23")
DTYPES = ("float32", "float16", "bfloat16")
# the references act/numeric_check.py holds (it imports nothing of the package, so the names live here too)
NUMERIC_REFERENCES = ("causal_conv1d", "causal_conv1d_update", "ssd", "selective_state_update", "selective_scan",
                      "gated_delta_rule")


def gencode_table(v, raw, e: str) -> dict:
    arch_table = v.table(raw, e)
    v.source(arch_table, e)
    gencode = {}
    for code, spec in v.table(arch_table.get("pairs"), f"{e}.pairs").items():
        if not (code.startswith("sm_") and code[3:].isdigit()):
            v.fail(f"{e}.pairs.{code}", "expected sm_XY (a -gencode code)")
        gencode[code] = v.specifier(spec, f"{e}.pairs.{code}")
    return gencode


def release_wheels(v, raw, e: str) -> ReleaseWheels:
    rel = v.table(raw, e)
    fname = v.string(rel.get("filename"), f"{e}.filename")
    for fieldname in ("{version}", "{cuda_major}", "{torch_mm}", "{abi}", "{py}", "{arch}"):
        if fieldname not in fname:
            v.fail(f"{e}.filename", f"the template must contain {fieldname}")
    base_url = v.string(rel.get("base_url"), f"{e}.base_url")
    builds = []
    for be, b in v.tables(rel.get("builds"), f"{e}.builds"):
        builds.append({
            "cuda_major": v.string(str(b.get("cuda_major", "")), f"{be}.cuda_major"),
            "torch_mm": v.strings(b.get("torch_mm"), f"{be}.torch_mm"),
            "python": v.strings(b.get("python"), f"{be}.python"),
            "arch": v.strings(b.get("arch"), f"{be}.arch"),
            "abi": v.strings(b.get("abi"), f"{be}.abi"),
        })
    sha = v.table(rel.get("sha256", {}), f"{e}.sha256")
    for key, digest in sha.items():
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            v.fail(f"{e}.sha256.{key}", "expected 64 lowercase hex digits")
    aliases = v.table(rel.get("torch_aliases", {}), f"{e}.torch_aliases")
    return ReleaseWheels(
        version=v.version(rel.get("version"), f"{e}.version"),
        tag=v.string(rel.get("tag"), f"{e}.tag"),
        base_url=base_url,
        filename=fname,
        builds=tuple(builds),
        torch_aliases={str(k): v.string(val, f"{e}.torch_aliases.{k}") for k, val in aliases.items()},
        sha256=dict(sha),
        source=v.source(rel, e),
    )


def source_build(v, raw, e: str, arch_rules=()) -> SourceBuild:
    sb = v.table(raw, e)
    measured = v.table(sb.get("measured"), f"{e}.measured")
    v.source(measured, f"{e}.measured")
    numbers = {}
    for key in ("seconds", "archs", "cores"):
        value = measured.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            v.fail(f"{e}.measured.{key}", "expected a positive number")
        numbers[key] = value
    gencode = gencode_table(v, sb.get("cuda_archs"), f"{e}.cuda_archs")
    bd = v.table(sb.get("build_deps", {"requirements": [], "source": "upstream: none"}), f"{e}.build_deps")
    v.source(bd, f"{e}.build_deps")
    build_deps = v.requirements(bd.get("requirements", []), f"{e}.build_deps.requirements")
    requirement = v.requirement(sb.get("requirement"), f"{e}.requirement")
    spec = list(Requirement(requirement).specifier)
    if len(spec) != 1 or spec[0].operator != "==":
        v.fail(f"{e}.requirement", f"{requirement!r}: expected one exact version (name==X): builds are cached by it")
    switch = cuda_switch(v, sb["cuda_switch"], f"{e}.cuda_switch") if "cuda_switch" in sb else None
    par = v.table(sb.get("parallel", {"translation_units": 1, "split_compile": False, "source": "upstream: not known"}),
                  f"{e}.parallel")
    units = par.get("translation_units", 1)
    if not isinstance(units, int) or isinstance(units, bool) or units < 1:
        v.fail(f"{e}.parallel.translation_units", "expected a positive whole number (the files the build compiles)")
    seconds = v.table(par.get("unit_seconds", {}), f"{e}.parallel.unit_seconds")
    for name, value in seconds.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            v.fail(f"{e}.parallel.unit_seconds.{name}", "expected a positive number (a file's measured compile)")
    split_units = par.get("split_units", [])
    if not isinstance(split_units, list) or not all(isinstance(u, str) and u in seconds for u in split_units):
        v.fail(f"{e}.parallel.split_units", "expected a list of file names that unit_seconds has")
    v.source(par, f"{e}.parallel")
    return SourceBuild(
        unit_seconds=tuple(sorted((str(k), float(x)) for k, x in seconds.items())), split_units=tuple(split_units),
        translation_units=units, split_compile=v.boolean(par.get("split_compile", False), f"{e}.parallel.split_compile"),
        requirement=requirement,
        env={str(k): str(x) for k, x in v.table(sb.get("env", {}), f"{e}.env").items()},
        rocm_env={str(k): str(x) for k, x in v.table(sb.get("rocm_env", {}), f"{e}.rocm_env").items()},
        build_deps=build_deps,
        seconds=float(numbers["seconds"]), archs=int(numbers["archs"]), cores=int(numbers["cores"]),
        cuda_archs=gencode,
        source=v.source(sb, e),
        arch_rules=tuple(arch_rules),
        cuda_switch=switch,
    )


def cuda_switch(v, raw, e: str) -> CudaSwitch:
    sw = v.table(raw, e)
    switch = CudaSwitch(env={str(k): str(x) for k, x in v.table(sw.get("env"), f"{e}.env").items()},
                        releases=v.specifier(sw.get("releases"), f"{e}.releases"),
                        needed_by=v.strings(sw.get("needed_by"), f"{e}.needed_by"),
                        triton_only=v.strings(sw.get("triton_only", []), f"{e}.triton_only"),
                        source=v.source(sw, e))
    if not switch.env:
        v.fail(f"{e}.env", "expected the variable that turns the CUDA build on")
    return switch


def cxx_standards(v, raw) -> tuple:
    if raw is None:
        return ()
    e = "cxx_standard"
    v.table(raw, e)
    v.source(raw, e)
    out = []
    for re_, r in v.tables(raw.get("rules"), f"{e}.rules"):
        std = v.string(r.get("std"), f"{re_}.std")
        if std not in STDS:
            v.fail(f"{re_}.std", f"{std!r}: expected one of {', '.join(STDS)}")
        out.append(CxxStandard(torch=v.specifier(r.get("torch"), f"{re_}.torch"), std=std, source=v.source(r, re_)))
    return tuple(out)


def _sm(v, value, entry) -> str:
    v.string(value, entry)
    if not (value.startswith("sm_") and value[3:].isdigit() and len(value) in (5, 6)):
        v.fail(entry, f"{value!r}: expected sm_XY (a CUDA compute capability)")
    return value


def arch_rules(v, raw, e: str) -> tuple:
    out = []
    for re_, r in v.tables(raw, e):
        gpu, build_as = _sm(v, r.get("gpu"), f"{re_}.gpu"), _sm(v, r.get("build_as"), f"{re_}.build_as")
        if gpu[3:-1] != build_as[3:-1] or int(build_as[-1]) > int(gpu[-1]):
            v.fail(f"{re_}.build_as", f"{build_as} code does not run on {gpu} (same major, a lower or equal minor)")
        wheels = r.get("wheels", "")
        if wheels not in ("", "avoid"):
            v.fail(f"{re_}.wheels", f"{wheels!r}: expected \"avoid\" or nothing")
        out.append(ArchRule(id=v.string(r.get("id"), f"{re_}.id"), gpu=gpu, nvcc=v.specifier(r.get("nvcc"), f"{re_}.nvcc"),
                            build_as=build_as, wheels=wheels, effect=v.string(r.get("effect"), f"{re_}.effect"),
                            source=v.source(r, re_)))
    return tuple(out)


def numeric_checks(v, raw, e: str) -> tuple:
    out, names = [], set()
    for ce, c in v.tables(raw, e):
        name = v.once(v.string(c.get("name"), f"{ce}.name"), names, f"{ce}.name")
        function = v.string(c.get("function"), f"{ce}.function")
        if ":" not in function:
            v.fail(f"{ce}.function", "expected module:function")
        shapes = v.table(c.get("shapes"), f"{ce}.shapes")
        for key, value in shapes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                v.fail(f"{ce}.shapes.{key}", "expected a positive whole number")
        dtype = v.string(c.get("dtype"), f"{ce}.dtype")
        if dtype not in DTYPES:
            v.fail(f"{ce}.dtype", f"{dtype!r}: expected one of {', '.join(DTYPES)}")
        options = v.table(c.get("options", {}), f"{ce}.options")
        for key, value in options.items():
            if not isinstance(value, (bool, int, float, str)):
                v.fail(f"{ce}.options.{key}", "expected a plain value")
        reference = v.string(c.get("reference"), f"{ce}.reference")
        if reference not in NUMERIC_REFERENCES:
            v.fail(f"{ce}.reference", f"{reference!r}: expected one of {', '.join(NUMERIC_REFERENCES)} (act/numeric_check.py)")
        gpus = v.strings(c.get("gpus", ["*"]), f"{ce}.gpus")
        backward_tol = c.get("backward_tolerance")
        out.append(NumericCheck(
            name=name, function=function, reference=reference,
            shapes=dict(shapes), dtype=dtype, tolerance=_tolerance(v, c.get("tolerance"), f"{ce}.tolerance"),
            backward=v.boolean(c.get("backward", False), f"{ce}.backward"), gpus=gpus,
            requires=v.strings(c.get("requires", []), f"{ce}.requires"), source=v.source(c, ce), options=dict(options),
            backward_tolerance=_tolerance(v, backward_tol, f"{ce}.backward_tolerance") if backward_tol else None))
    return tuple(out)


def _tolerance(v, raw, e: str) -> dict:
    tol = v.table(raw, e)
    out = {}
    for key, value in tol.items():
        if key not in ("atol", "rtol", "ratio"):
            v.fail(f"{e}.{key}", "expected atol, rtol or ratio")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            v.fail(f"{e}.{key}", "expected a number >= 0")
        out[key] = float(value)
    if ("atol" in out) != ("rtol" in out) or not out:
        v.fail(e, "expected atol with rtol (elementwise), ratio (rms error over rms of torch's result), or both")
    return out


def release_issues(v, raw, e: str) -> tuple:
    """A pinned release's `issues`: [{gpu: [sm_XY...], id, effect, source}]."""
    out = []
    for ie, x in v.tables(raw, e):
        out.append(ReleaseIssue(gpus=v.strings(x.get("gpu"), f"{ie}.gpu"), id=v.string(x.get("id"), f"{ie}.id"),
                                effect=v.string(x.get("effect"), f"{ie}.effect"), source=v.source(x, ie)))
    return tuple(out)
