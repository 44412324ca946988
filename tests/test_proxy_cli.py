"""The proxy's commands: `status` against a running proxy and none, and the options that are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anthropic

from sidecar.testing import FakeProvider
from tests.helpers.proxy import running_proxy


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True, text=True, timeout=60,
                          env=env)


async def test_status_prints_the_running_proxy_s_figures_per_session(tmp_path: Path) -> None:
    with FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                                         extra_headers={"x-context-sidecar-session": "figures"})
            port = proxy.url.rsplit(":", 1)[1]
            shown = cli("status", "--port", port)
            raw = cli("status", "--port", port, "--json")
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.strip().startswith("figures"))
    assert line.split()[1:3] == ["anthropic", "1"]
    assert '"sessionId": "figures"' in raw.stdout


def test_status_without_a_proxy_says_so_and_exits_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        result = cli("status", "--port", str(probe.getsockname()[1]))
    assert result.returncode == 1 and "no context-sidecar proxy on 127.0.0.1:" in result.stderr


def test_settings_that_are_not_a_json_object_are_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "settings.json"
    bad.write_text("[1, 2]")
    for args in (["--settings", str(bad)], ["--settings", str(tmp_path / "missing.json")], ["--settings", "{oops"]):
        result = cli("proxy", "--port", "0", *args)
        assert result.returncode == 2, result.stderr
        assert "--settings" in result.stderr


def test_wrap_an_agent_that_is_not_on_path_exits_127(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    result = cli("wrap", "--port", "0", "--db", str(tmp_path / "w.duckdb"), "--log-file", str(tmp_path / "log"),
                 "claude", "--", "-p", "hi", env=env)
    assert result.returncode == 127 and "claude is not on PATH" in result.stderr
