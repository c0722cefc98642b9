"""`enable` / `disable` never leave a sitecustomize.py that does not compile, and give the user's lines back.

Issue 17, defect 1: a user file without a trailing newline, `enable`, a line appended, `disable` glued
the two lines together - `Error in sitecustomize ... SyntaxError` at every `python` start.

- Round trips on real files with hypothesis-generated user files (no trailing newline, CRLF and CR line
  ends, a BOM, lines that look like the block's markers, edits between enable and disable): whatever
  is written compiles, and the user's lines come back - byte for byte when they did not touch the file.
- A few fixed cases through the real command line in a real venv (a bare `python -m venv`, the package
  on PYTHONPATH), each checked with a real `python -c pass`.
"""

from __future__ import annotations

import os
import subprocess
import venv as venv_module

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fastpath_hooks.hooks import activation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOM = b"\xef\xbb\xbf"

# The user's own lines: statements, comments, non-ASCII text, and lines that look like our markers
# (indented, inside a string, without the format tag, a begin line without an end line, an end line alone).
USER_LINES = [
    (b"import os",), (b"x = 1",), (b"# my start-up code",), (b"",), (b"USER = '\xc3\xa9t\xc3\xa9'",),
    (b"if True:", b"    y = 2"),
    (b"# >>> fastpath-hooks",), (b"# >>> fastpath-hooks >>>",), (b"# >>> fastpath-hooks >>> my notes",),
    (b"# >>> fastpath-hooks >>> v5",), (b"# >>> fastpath-hooks >>> v5 created newline",), (b"# <<< fastpath-hooks <<<",),
    (b"s = '# >>> fastpath-hooks >>> v5'",), (b"    # >>> fastpath-hooks >>> v5 created",),
]
ENDS = [b"\n", b"\r\n", b"\r"]


def _compiles(data: bytes) -> bool:
    try:
        compile(data, "sitecustomize.py", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


@st.composite
def user_files(draw):
    """(content, whether it starts with a BOM): a file of the user's that compiles."""
    texts = [line for item in draw(st.lists(st.sampled_from(USER_LINES), min_size=1, max_size=6)) for line in item]
    ends = [draw(st.sampled_from(ENDS)) for _ in texts]
    if draw(st.booleans()):
        ends[-1] = b""                           # no line end after the last line
    bom = draw(st.booleans())
    content = (BOM if bom else b"") + b"".join(t + e for t, e in zip(texts, ends))
    assume(content and _compiles(content))
    return content, bom


# Edits between enable and disable, at line boundaries, as an editor or `echo ... >>` makes them.
edits = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sampled_from([b"x = 1", b"z = 3", b"# added later"]), st.sampled_from(ENDS + [b""])),
    st.tuples(st.just("insert"), st.sampled_from([b"w = 4", b"# inserted"]), st.integers(0, 8)),
    st.tuples(st.just("change"), st.sampled_from([b"x = 2", b"# changed"]), st.integers(0, 8)),
), max_size=4)


def _edit(content: bytes, changes, bom: bool):
    """Apply `changes` to the enabled file's lines outside the block; (new content, the user's lines
    expected after disable: the lines without line ends, the block's taken out; whether those compile -
    an edit may break the user's own code, e.g. a line inserted between `if True:` and its body)."""
    found = activation.find_block(content)
    assert found is not None
    lines, first, last, _ = found
    before, block, after = lines[:first], lines[first:last + 1], lines[last + 1:]
    for kind, text, arg in changes:
        if kind == "append":
            if after and not after[-1].endswith((b"\n", b"\r")):
                continue                         # the user would glue their own lines: not ours to test
            after.append(text + arg)
        elif kind == "insert":
            at = min(arg, len(before))
            if bom and at == 0:
                at = 1 if before else 0          # an editor keeps the BOM first
            if bom and not before:
                continue
            before.insert(at, text + b"\n")
        elif kind == "change" and before:
            at = min(arg, len(before) - 1)
            line = before[at]
            keep = BOM if bom and at == 0 else b""
            body = line.rstrip(b"\r\n")
            before[at] = keep + text + line[len(body):]
    new = b"".join(before + block + after)
    expected = [line.rstrip(b"\r\n") for line in before + after]
    return new, expected, _compiles(b"".join(before + after))


def _lines(data: bytes) -> list:
    return [line.rstrip(b"\r\n") for line in data.splitlines(keepends=True)]


class _InMemory:
    """The same steps as `write_block` / `remove_block` on a real file, on bytes (many examples, fast)."""

    def __init__(self):
        self.data = None

    def write(self, created: bool) -> None:
        data = activation.with_block(b"" if created else self.data, created=created)
        problem = activation.compile_problem(data, "sitecustomize.py")
        if problem:
            raise activation.ActivationError(problem)
        self.data = data

    def remove(self) -> str:
        restored, created = activation.without_block(self.data)
        if created and not restored:
            self.data = None
            return "removed"
        problem = activation.compile_problem(restored, "sitecustomize.py")
        if problem:
            raise activation.ActivationError(f"would not compile ({problem})")
        self.data = restored
        return "restored"


class _OnDisk:
    def __init__(self, path: str):
        self.path = path

    @property
    def data(self):
        if not os.path.exists(self.path):
            return None
        with open(self.path, "rb") as fh:
            return fh.read()

    @data.setter
    def data(self, value):
        if os.path.exists(self.path):
            os.unlink(self.path)
        if value is not None:
            with open(self.path, "wb") as fh:
                fh.write(value)

    def write(self, created: bool) -> None:
        activation.write_block(self.path, created=created)

    def remove(self) -> str:
        return activation.remove_block(self.path)


def _round_trip(file, user, changes, created, twice) -> None:
    content, bom = user
    if created:  # no sitecustomize.py yet: enable creates it
        content, bom = b"", False
    file.data = None if created else content
    file.write(created)
    if twice:
        file.write(False)   # enable again: still one block
    enabled = file.data
    assert _compiles(enabled)
    marker = activation.BEGIN.encode() + b" v"
    assert enabled.startswith(content) and enabled.count(marker) == 1 + content.count(marker)
    edited, expected, valid = _edit(enabled, changes, bom)
    file.data = edited
    if not valid:   # the user broke their own lines: nothing is written, the line to fix is named
        with pytest.raises(activation.ActivationError, match="would not compile .*line"):
            file.remove()
        assert file.data == edited
        return
    done = file.remove()
    assert done is not None
    restored = file.data
    if restored is None:   # created by enable and nothing of the user's in it
        assert created and expected == [], done
        return
    assert _compiles(restored), (edited, restored)
    if edited == enabled:
        assert restored == content          # untouched: byte for byte
    else:
        assert _lines(restored) == expected, (edited, restored)
    assert activation.find_block(restored) is None


@settings(max_examples=200, deadline=None)
@given(user=user_files(), changes=edits, created=st.booleans(), twice=st.booleans())
def test_enable_disable_round_trips_compile_and_keep_the_users_lines(user, changes, created, twice):
    _round_trip(_InMemory(), user, changes, created, twice)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=user_files(), changes=edits, created=st.booleans(), twice=st.booleans())
def test_the_same_round_trips_on_real_files(tmp_path, user, changes, created, twice):
    """write_block / remove_block: the compile check before the atomic replace, and the .pyc."""
    _round_trip(_OnDisk(str(tmp_path / "sitecustomize.py")), user, changes, created, twice)


def test_a_users_pair_of_marker_lines_is_not_taken_for_the_block(tmp_path):
    path = str(tmp_path / "sitecustomize.py")
    own = b"# >>> fastpath-hooks >>> v5 created\nx = 1\n# <<< fastpath-hooks <<<\n"
    with open(path, "wb") as fh:
        fh.write(own)
    activation.write_block(path, created=False)
    activation.remove_block(path)
    with open(path, "rb") as fh:
        assert fh.read() == own     # the lines between the user's markers survive, and the file too


# -- the command line in a real venv --------------------------------------------------------

@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A real venv without pip (made in well under a second), the package from this checkout on PYTHONPATH."""
    path = str(tmp_path_factory.mktemp("bare") / "venv")
    venv_module.EnvBuilder(with_pip=False).create(path)
    python = os.path.join(path, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPATH_HOOKS_", "PYTHON"))}
    env["PYTHONPATH"] = ROOT
    return python, site, env


def _cli(bare, *args):
    python, _, env = bare
    return subprocess.run([python, "-m", "fastpath_hooks", *args], capture_output=True, text=True, env=env)


def _python_starts(bare) -> subprocess.CompletedProcess:
    python, _, env = bare
    return subprocess.run([python, "-c", "pass"], capture_output=True, text=True, env=env)


CASES = {
    # the repro: printf 'import os' > sitecustomize.py; enable; echo 'x = 1' >> ...; disable
    "no-newline-then-appended": (b"import os", b"x = 1\n", b"import os\nx = 1\n"),
    "crlf-bom-appended": (BOM + b"import os\r\nUSER = 1", b"z = 3\r\n", BOM + b"import os\r\nUSER = 1\nz = 3\r\n"),
    "untouched-no-newline": (b"import os", b"", b"import os"),
    "lookalike-begin-line": (b"# >>> fastpath-hooks >>> v5\nimport os\n", b"# >>> fastpath-hooks >>> v5 notes\n",
                             b"# >>> fastpath-hooks >>> v5\nimport os\n# >>> fastpath-hooks >>> v5 notes\n"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_disable_after_the_user_edited_leaves_a_python_that_starts(bare, case):
    user, appended, expected = CASES[case]
    _, site, _ = bare
    path = os.path.join(site, "sitecustomize.py")
    with open(path, "wb") as fh:
        fh.write(user)
    try:
        enabled = _cli(bare, "enable", "--method", "sitecustomize")
        assert enabled.returncode == 0, enabled.stderr
        assert _python_starts(bare).stderr == ""
        with open(path, "ab") as fh:
            fh.write(appended)
        disabled = _cli(bare, "disable")
        assert disabled.returncode == 0, disabled.stderr
        with open(path, "rb") as fh:
            assert fh.read() == expected
        started = _python_starts(bare)
        assert (started.returncode, started.stderr) == (0, "")
    finally:
        os.unlink(path)


def test_nothing_that_would_not_compile_is_written(bare):
    _, site, _ = bare
    path = os.path.join(site, "sitecustomize.py")
    broken = b"import os\nif True\n"
    with open(path, "wb") as fh:
        fh.write(broken)
    try:
        # enable refuses a file that does not compile already (ours would never run there), naming the line
        refused = _cli(bare, "enable", "--method", "sitecustomize")
        assert refused.returncode == 2 and "does not compile (line 2" in refused.stderr, refused.stderr
        with open(path, "rb") as fh:
            assert fh.read() == broken
        # the user breaks their own line after enable: disable writes nothing and says which line to fix
        with open(path, "wb") as fh:
            fh.write(b"import os\n")
        assert _cli(bare, "enable", "--method", "sitecustomize").returncode == 0
        with open(path, "rb") as fh:
            enabled = fh.read()
        with open(path, "wb") as fh:
            fh.write(enabled.replace(b"import os\n", b"import os\nif True\n", 1))
        with open(path, "rb") as fh:
            edited = fh.read()
        kept = _cli(bare, "disable")
        assert kept.returncode == 2 and "would not compile" in kept.stderr and "line 2" in kept.stderr, kept.stderr
        with open(path, "rb") as fh:
            assert fh.read() == edited
        assert not [n for n in os.listdir(site) if n.endswith(".fastpath-hooks.tmp")]
    finally:
        os.unlink(path)
