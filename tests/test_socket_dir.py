"""Where host sockets live when the environment is cut down, as agents cut it for their MCP servers."""

from __future__ import annotations

import os
from pathlib import Path
from unittest.mock import patch

from sidecar.config import sockets


def test_without_xdg_runtime_dir_the_login_sessions_run_dir_then_tmp_never_tmpdir(tmp_path: Path) -> None:
    run_user = tmp_path / "run-user"
    run_user.mkdir(mode=0o700)
    stripped = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    with patch.dict(os.environ, {**stripped, "TMPDIR": str(tmp_path / "tmpdir")}, clear=True):
        with patch.object(sockets, "RUN_USER", str(run_user)):
            assert sockets.runtime_dir() == run_user / "context-sidecar"
        with patch.object(sockets, "RUN_USER", str(tmp_path / "absent")):
            assert sockets.runtime_dir() == Path("/tmp") / f"context-sidecar-{os.getuid()}"
    with patch.dict(os.environ, {"XDG_RUNTIME_DIR": str(tmp_path)}):
        assert sockets.runtime_dir() == tmp_path / "context-sidecar"
