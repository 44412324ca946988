"""scripts/setup.sh installs what its caller runs: the package alone for the demo, the test tools for the tests."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The scripts and pyproject.toml, with a .venv whose python only writes down how it was called."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    python.chmod(0o755)
    return tmp_path


def setup(checkout: Path, *args: str) -> list[str]:
    """Run setup.sh; the pip commands it ran."""
    calls = checkout / "calls"
    calls.unlink(missing_ok=True)
    subprocess.run([str(checkout / "scripts" / "setup.sh"), *args], check=True, timeout=60)
    return calls.read_text().splitlines() if calls.exists() else []


def test_the_demo_installs_the_package_alone_and_the_tests_add_their_tools(checkout: Path) -> None:
    digest = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()
    assert setup(checkout, "--run") == ["-m pip install --quiet --disable-pip-version-check -e ."]
    assert (checkout / ".venv" / ".installed").read_text().split() == [digest, "run"]
    assert setup(checkout, "--run") == []  # nothing changed
    assert setup(checkout)[-1] == "-m pip install --quiet -e .[test]"
    assert setup(checkout) == []
    assert setup(checkout, "--run") == []  # the test install has everything the demo runs
    (checkout / "pyproject.toml").write_text((checkout / "pyproject.toml").read_text() + "\n")
    assert setup(checkout, "--run") == ["-m pip install --quiet --disable-pip-version-check -e ."]
