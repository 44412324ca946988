"""Reading a growing transcript from where its last turn started yields what reading it whole would, for that part."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.types import ImportParams
from sidecar.importers import parse_transcript
from sidecar.services import transcripts
from sidecar.testing.transcripts import ClaudeCodeWriter

FIXTURES = Path(__file__).parent / "fixtures"


def generated(tmp_path: Path) -> Path:
    writer = ClaudeCodeWriter(tmp_path / "generated.jsonl", "/srv/ws", session_id="gen")
    for turn in range(3):
        writer.turn(turn, output_bytes=300)
    writer.compact("Three turns done.")
    writer.turn(3, output_bytes=300)
    return writer.path


@pytest.mark.parametrize("name", ["claude-code-2.1-parallel.jsonl", "codex-0.46-rollout.jsonl",
                                  "pi-v3-thinking.jsonl", "generated"])
def test_a_window_from_any_resume_point_reads_what_a_whole_read_does(tmp_path: Path, name: str) -> None:
    source = generated(tmp_path) if name == "generated" else FIXTURES / name
    lines = source.read_text().splitlines(keepends=True)
    fmt = parse_transcript(source).format
    whole = parse_transcript(source)
    by_id = {m["id"]: m for m in whole.messages}
    live = tmp_path / "live.jsonl"
    windows = 0
    for count in range(1, len(lines)):
        live.write_text("".join(lines[:count]))
        params = ImportParams(path=str(live), format=fmt, follow=True)
        try:
            earlier = transcripts.read(live, params, resumable=True)
        except transcripts.SidecarError:
            continue  # nothing to import yet
        if earlier.resume is None:
            continue
        live.write_text("".join(lines))
        window = transcripts.read(live, params, start=earlier.resume)
        windows += 1
        assert window.window and not window.parsed.incomplete
        for message in window.parsed.messages:
            assert message == by_id[message["id"]], (count, message["id"])
        wanted = [m["id"] for m in whole.messages if whole.spans.get(m["id"], (0, 0))[0] >= earlier.resume.line]
        assert set(wanted) <= {m["id"] for m in window.parsed.messages}, count
        assert [c.id for c in window.parsed.compactions] == [c.id for c in whole.compactions
                                                             if c.line >= earlier.resume.line]
    assert windows > 0


def test_a_file_rewritten_in_place_is_not_resumed(tmp_path: Path) -> None:
    path = generated(tmp_path)
    first = transcripts.read(path, ImportParams(path=str(path), follow=True), resumable=True)
    assert first.resume is not None and first.resume.still_there(path)
    with path.open("r+") as fh:  # the same inode and size, other bytes where the window starts
        text = fh.read()
        fh.seek(0)
        fh.write(text.swapcase())
    assert not first.resume.still_there(path)
