"""The README's examples run as written: the code blocks of "Agent runs that survive crashes" (its subsections
included) are taken from README.md and run in order, in one fresh process, in an empty directory."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def section_blocks(title: str) -> list[str]:
    """The ```python blocks of the README section ``## title``, up to the next ``## `` heading, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def test_the_agent_runs_section_runs_as_written(tmp_path: pathlib.Path) -> None:
    blocks = section_blocks("Agent runs that survive crashes")
    assert len(blocks) >= 2, blocks
    script = "\n".join(blocks)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()  # the example keeps structlog's lines off stdout
    assert printed == [
        "CheckpointStatus.COMPLETED RESULTS FOR WHY FENCE?",
        "CheckpointStatus.COMPLETED RESULTS FOR WHY CLAIMS?",  # the second turn searched again
    ], done.stdout
    assert (tmp_path / "agent.db").exists()



def test_the_access_schemas_section_runs_as_written(tmp_path: pathlib.Path) -> None:
    blocks = section_blocks("Access schemas")
    assert len(blocks) == 1, blocks
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["committed c1: ['c1'] []"], done.stdout
    again = subprocess.run(  # found by a user: a second run on the same file failed with CheckpointConflict
        [sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["committed c2: ['c2', 'c1'] []"], again.stdout


def test_the_asyncio_section_runs_as_written(tmp_path: pathlib.Path) -> None:
    blocks = section_blocks("asyncio")
    assert len(blocks) == 1, blocks
    # the block routes structlog's lines to stderr itself: stdout holds only what it prints
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "None",
        "1 threadloom.run_started",
        "2 searched",
        "3 threadloom.run_completed",
        "CheckpointStatus.COMPLETED RESULTS",
    ], done.stdout
