"""Lines results pages share: the page's plot, embedded by a link relative to the page, and the code
revisions the page's records come from."""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

_COMMIT = re.compile(r"([0-9a-f]{40})(\+dirty)?")
_SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def plot_line(page: Path, plot: Path, alt: str) -> str:
    """Markdown that shows `plot` on `page`."""
    return f"![{alt}]({Path(os.path.relpath(plot, Path(page).parent)).as_posix()})"


def short_revision(revision: str | None) -> str:
    """A commit as its 7-character prefix ("+dirty" kept); "unknown" and the like as they are."""
    if revision is None:
        return "not recorded"
    match = _COMMIT.fullmatch(revision)
    return revision if match is None else match.group(1)[:7] + (match.group(2) or "")


def revisions_line(records: list[dict]) -> str:
    """"Numbers from revision(s) …": each revision with how many records it produced, most first; a
    revision that was inferred rather than recorded carries a numbered note (its `revision_note`)."""
    if not records:
        return "No records yet."
    counts = Counter((short_revision(r.get("revision")), r.get("revision_note") or "") for r in records)
    groups = sorted(counts.items(), key=lambda item: (-item[1], *item[0]))
    notes = list(dict.fromkeys(note for (_, note), _ in groups if note))
    marks = {note: str(i).translate(_SUPERSCRIPTS) for i, note in enumerate(notes, start=1)}
    parts = [f"`{revision}`{marks.get(note, '')} ({count} record{'s' if count != 1 else ''})"
             for (revision, note), count in groups]
    return (f"Numbers from revision{'s' if len(groups) > 1 else ''} {', '.join(parts)}."
            + "".join(f" {marks[note]} {note[0].upper()}{note[1:]}." for note in notes))
