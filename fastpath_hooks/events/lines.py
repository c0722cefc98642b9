"""One human line: `fastpath-hooks: message`, fitted to MAX_LINE characters, on stderr."""

from __future__ import annotations

import os
import sys

MAX_LINE = 160          # characters, "fastpath-hooks: " included
PREFIX = "fastpath-hooks: "


def fit(message: str, limit: int = MAX_LINE, *, cut_words_only: bool = False) -> str:
    """`fastpath-hooks: message` on one line of at most `limit` characters. Over-long words (a path,
    a wheel name, a quoted value) are cut in the middle first, so the sentence and its fix stay;
    the whole text is in the debug log (FASTPATH_HOOKS_LOG=debug prints lines whole). A build log's path
    is never cut (every message about a build names it): the line then ends after it, even past `limit`.
    cut_words_only: only the long words are cut, the line may stay longer than `limit`."""
    words = message.split()
    line = PREFIX + " ".join(words)

    def value(word):  # VARIABLE='value': only the value may be cut
        return len(word) - word.find("=") - 1

    for i in sorted(range(len(words)), key=lambda i: -value(words[i])):
        if len(line) <= limit or value(words[i]) < 48:   # shorter words read better whole
            break
        if _is_log(words[i]):
            continue
        word = words[i]
        head = word.find("=") + 3   # VARIABLE='value': the name stays whole
        keep = max(36, head + 16, len(word) - (len(line) - limit) - 3)
        head = max(keep // 2, head)
        words[i] = word[:head] + "..." + word[len(word) - (keep - head):]
        line = PREFIX + " ".join(words)
    if len(line) > limit and not cut_words_only:
        logs = [i for i, w in enumerate(words) if _is_log(w)]
        # cut at the end - but never before a build log's path ends
        end = len(PREFIX + " ".join(words[:logs[-1] + 1])) if logs else 0
        if end < len(line):
            cut = line[:max(limit - 3, end)]
            space = cut.rfind(" ")   # at a word's end where one is near
            line = (cut[:space] if space > max(end, len(cut) - 16) else cut).rstrip() + "..."
    return line


def _is_log(word: str) -> bool:
    return word.rstrip(";,)").endswith(".log")


def first_fitting(*candidates: str) -> str:
    """The first of a line's wordings, longest and most whole first, that fits MAX_LINE; else the last,
    fitted (events.fit: a long word cut in its middle first)."""
    for line in candidates:
        if len(PREFIX) + len(" ".join(line.split())) <= MAX_LINE:
            return line
    return fit(candidates[-1])[len(PREFIX):]


def fitted(head: str, detail: str, fix: str = "", *, whole_at: str | None = "fastpath-hooks doctor") -> str:
    """`<head><detail> (<fix>)` for a text handed over whole (a failed check's or install's output, an
    exception, a path): whole when it fits; else as much of the detail as fits - a long word cut in its
    middle first, never a build log's path - with the head and the fix kept and where it is whole
    (`whole_at`; None where the fix itself says it again)."""
    whole = head + " ".join(str(detail).split()) + (f" ({fix})" if fix else "")
    if len(PREFIX) + len(whole) <= MAX_LINE:
        return whole
    where = f"the whole: {whole_at}" if whole_at else ""
    tail = f" ({'; '.join(p for p in (fix, where) if p)})" if fix or where else ""
    room = MAX_LINE - len(PREFIX) - len(head) - len(tail)
    text = " ".join(str(detail).split())
    cut = fit(text, room + len(PREFIX))[len(PREFIX):]
    if cut.endswith("...") and not any(_is_log(w) for w in text.split()):   # an error chain: its middle goes
        cut = _middle_out(fit(text, room + len(PREFIX), cut_words_only=True)[len(PREFIX):], room) or cut
    return head + cut + tail


_LEAST_ERROR = 20   # characters of the error a middle cut must keep (else the end is cut instead)


def _middle_out(text: str, room: int) -> str | None:
    """A handed-over error chain cut in its middle, by clauses (": "): its first says what failed
    ("verification failed", "could not download <url>"), its last ones the error itself ("broken on purpose
    (tests)", "[Errno 28] No space left on device"), as many of them as fit. What goes first: trailing
    clauses that are only a path or URL (details: "...: ..."), then the clauses between, then the end of
    the first clause, then a remark after the error ("(...)"). None when what would be left of the
    error is too little to say anything."""
    parts = text.split(": ")
    if len(parts) < 2:
        return None
    end = len(parts)
    while end > 2 and _is_detail(parts[end - 1]):
        end -= 1
    more = ": ..." if end < len(parts) else ""
    for k in range(1, end):   # drop clauses 1..k-1, the fewest that make it fit
        tail = ": ".join(parts[k:end]) + more
        line = f"{parts[0]}: {'' if k == 1 else '... '}{tail}"
        if len(line) <= room:
            return line if len(tail) >= _LEAST_ERROR else None
    clause = parts[end - 1]
    if len(clause) < _LEAST_ERROR:
        return None
    remark = clause.rfind(" (")   # a remark after the error ("... refused> (X_URL points at a mirror)") goes next
    for error in (clause, clause[:remark] + " (...)" if remark >= _LEAST_ERROR and clause.endswith(")") else None):
        if error is None:
            continue
        error += more                     # the error alone, after as much of what failed as fits
        left = room - len(error) - len("...: ")
        if left >= 12:
            first = parts[0][:left]
            space = first.rfind(" ")
            return f"{first[:space] if space > left // 2 else first}...: {error}"
    return None


def _is_detail(clause: str) -> bool:
    """A clause that is only a path, a URL or a quoted value: where an error happened, not what it is."""
    word = clause.strip().strip("'\"")
    return bool(word) and " " not in word and (word.startswith(("/", "~", ".")) or "://" in word)


def shown_path(path: str) -> str:
    """A path as a line shows it, short and still what a shell expands back: under the cache directory
    the user set, $XDG_CACHE_HOME or the home directory, written `$FASTPATH_HOOKS_CACHE_DIR/...`,
    `$XDG_CACHE_HOME/...`, `~/...` (the debug log and doctor have it whole)."""
    for var in ("FASTPATH_HOOKS_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        root = os.environ.get(var, "").strip()
        if len(root) > 1:
            root = os.path.abspath(os.path.expanduser(root)).rstrip("/")
            if path.startswith(root + "/"):
                return ("~" if var == "HOME" else "$" + var) + path[len(root):]
    return path


def write(message: str, *, whole: bool) -> None:
    """Print the line (whole: FASTPATH_HOOKS_LOG=debug asks for the details); never raises."""
    line = PREFIX + " ".join(message.split()) if whole else fit(message)
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:
        pass
