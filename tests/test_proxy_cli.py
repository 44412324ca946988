"""The proxy's commands: `status` against a running proxy and none, and the options that are refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx2

from sidecar.cli.main import build_parser
from sidecar.cli.wrap_command import codex_provider
from sidecar.client import SidecarClient
from sidecar.proxy.jsontext import object_members
from sidecar.testing import FakeProvider
from sidecar.testing.refusing_proxy import RefusingProxy
from tests.helpers.proxy import WAIT, markers, running_proxy


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


async def test_status_counts_what_was_sent_and_forwarded_alike(tmp_path: Path) -> None:
    """A conversation forwarded whole is forwarded at its size: the proxy's cache markers are no prompt."""
    system = '[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}]'
    turns = ['{"role":"user","content":[{"type":"text","text":"first question"}]}']
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json",
               "x-context-sidecar-session": "alike"}
    with FakeProvider(responder=lambda request: "an answer") as fake:
        async with running_proxy(tmp_path, fake.url) as proxy, httpx2.AsyncClient(timeout=WAIT) as client:
            for question in ("second question", "third question"):
                body = f'{{"model":"m","max_tokens":9,"system":{system},"messages":[{",".join(turns)}]}}'
                answer = await client.post(f"{proxy.url}/v1/messages", content=body.encode(), headers=headers)
                _, spans, _ = object_members(answer.text)
                start, end = spans["content"]  # the agent sends the answer back as the provider wrote it
                turns += ['{"role":"assistant","content":' + answer.text[start:end] + "}",
                          f'{{"role":"user","content":[{{"type":"text","text":"{question}"}}]}}']
            shown = await asyncio.to_thread(cli, "status", "--port", proxy.url.rsplit(":", 1)[1])
    assert [markers(r.raw) >= 2 for r in fake.model_requests] == [True, True], "the proxy marked the messages too"
    line = next(line for line in shown.stdout.splitlines() if line.strip().startswith("alike"))
    requests, sent, forwarded = line.split()[2:5]
    assert requests == "2" and sent == forwarded, shown.stdout
    assert "cache markers left out" in shown.stdout


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


def test_a_prepare_timeout_that_is_not_a_positive_number_is_a_usage_error() -> None:
    for value in ("0", "-1", "soon", "nan", "inf"):
        result = cli("proxy", "--port", "0", "--prepare-timeout", value)
        assert result.returncode == 2, result.stderr
        assert "--prepare-timeout" in result.stderr and value in result.stderr


def test_wrap_an_agent_that_is_not_on_path_exits_127(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    result = cli("wrap", "--port", "0", "--db", str(tmp_path / "w.duckdb"), "--log-file", str(tmp_path / "log"),
                 "claude", "--", "-p", "hi", env=env)
    assert result.returncode == 127 and "claude is not on PATH" in result.stderr


def fake_claude(directory: Path) -> Path:
    """A `claude` on PATH that asks its base URL (ANTHROPIC_BASE_URL, as Claude Code takes it) once and prints the
    answer; its arguments go to ``argv.json`` beside it."""
    script = directory / "claude"
    script.write_text(f"#!{sys.executable}\n"
                      "import anthropic, json, pathlib, sys\n"
                      "pathlib.Path(sys.argv[0]).with_name('argv.json').write_text(json.dumps(sys.argv[1:]))\n"
                      "reply = anthropic.Anthropic(api_key='gateway-token', max_retries=0).messages.create(\n"
                      "    model='m', max_tokens=5, messages=[{'role': 'user', 'content': 'hi'}],\n"
                      "    extra_headers={'x-context-sidecar-session': 'wrapped'})\n"
                      "print(reply.content[0].text)\n")
    script.chmod(0o755)
    return script


def wrap_env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([str(tmp_path), os.environ["PATH"]]), "HOME": str(tmp_path),
            "NO_PROXY": "127.0.0.1,localhost", **more}


def test_wrap_sends_the_agent_s_requests_to_its_own_base_url(tmp_path: Path) -> None:
    fake_claude(tmp_path)
    with FakeProvider(responder=lambda request: "from the gateway", api_key="gateway-token") as gateway:
        result = cli("wrap", "--port", "0", "--db", str(tmp_path / "w.duckdb"), "--log-file",
                     str(tmp_path / "log"), "claude", "-p", "hello",
                     env=wrap_env(tmp_path, ANTHROPIC_BASE_URL=gateway.url))
        assert result.returncode == 0, result.stderr + (tmp_path / "log").read_text()
        assert result.stdout.strip() == "from the gateway"  # the gateway took the agent's token
        assert len(gateway.model_requests) == 1
    assert json.loads((tmp_path / "argv.json").read_text()) == ["-p", "hello"], "no -- needed before its arguments"


def test_wrap_gives_the_agent_what_follows_its_name() -> None:
    parser = build_parser()
    for after in ([], ["-p", "hello"], ["--", "-p", "hello"], ["--port", "9", "--db", "x"]):
        parsed = parser.parse_args(["wrap", "--port", "0", "claude", *after])
        assert (parsed.port, parsed.db, parsed.args) == (0, None, [a for a in after if a != "--"])


async def test_wrap_uses_a_running_proxy_only_when_it_has_the_same_database_and_upstream(tmp_path: Path) -> None:
    fake_claude(tmp_path)
    with FakeProvider(responder=lambda request: "ok") as fake:
        upstream = fake.url
        async with running_proxy(tmp_path, upstream) as proxy:
            port = proxy.url.rsplit(":", 1)[1]

            def wrap(*options: str, **env: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([sys.executable, "-m", "sidecar", "wrap", "--port", port, *options, "claude"],
                                      capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                      env=wrap_env(tmp_path, **env))

            same = await asyncio.to_thread(wrap, "--db", "proxy.duckdb", ANTHROPIC_BASE_URL=fake.url)
            elsewhere = await asyncio.to_thread(wrap, "--anthropic-upstream", "http://127.0.0.1:9")
    assert same.returncode == 0 and same.stdout.strip() == "ok", same.stderr  # the same database, named otherwise
    assert elsewhere.returncode == 2
    assert f"sends anthropic requests to {upstream}, not http://127.0.0.1:9" in elsewhere.stderr


def test_codex_s_built_in_provider_is_pointed_at_the_proxy_by_its_base_url_alone(tmp_path: Path) -> None:
    provider = codex_provider({"HOME": str(tmp_path), "OPENAI_BASE_URL": "https://gateway.example/v1"})
    assert provider.base_url == "https://gateway.example/v1"  # where its requests went: the proxy's upstream
    assert provider.overrides("http://127.0.0.1:1") == ["-c", 'openai_base_url="http://127.0.0.1:1/openai/v1"']


def test_under_wrap_whatever_the_agent_asks_goes_to_its_own_provider_and_nowhere_else(tmp_path: Path) -> None:
    script = tmp_path / "claude"  # asks a route the proxy does not assemble, without anthropic-version
    script.write_text(f"#!{sys.executable}\n"
                      "import os, httpx2\n"
                      "base = os.environ['ANTHROPIC_BASE_URL']\n"
                      "files = httpx2.get(base + '/v1/files', headers={'x-api-key': 'sk-ant-secret'}, timeout=60)\n"
                      "print(files.status_code)\n")
    script.chmod(0o755)
    with FakeProvider() as anthropic_side, RefusingProxy() as refusing:
        # The OpenAI upstream is the public one, through the refusing proxy: any request to it shows there.
        result = cli("wrap", "--port", "0", "--db", str(tmp_path / "w.duckdb"), "--log-file", str(tmp_path / "log"),
                     "--anthropic-upstream", anthropic_side.url, "claude",
                     env={**wrap_env(tmp_path), **refusing.env()})
        attempts = refusing.attempts
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "404"  # the provider's own answer: it has no such route
    assert [(r.method, r.path, r.headers.get("x-api-key")) for r in anthropic_side.requests] == [
        ("GET", "/v1/files", "sk-ant-secret")]
    assert attempts == []


async def test_status_says_when_the_sidecar_cannot_take_requests_and_why(tmp_path: Path) -> None:
    db = tmp_path / "proxy.duckdb"
    holder = await SidecarClient.spawn(command=[sys.executable, "-m", "sidecar", "--no-share"], db=str(db))
    try:
        await holder.sessions()  # it holds the file once this answers
        with FakeProvider(responder=lambda request: "ok") as fake:
            async with running_proxy(tmp_path, fake.url) as proxy:
                client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
                reply = await client.messages.create(model="m", max_tokens=5, extra_headers={
                    "x-context-sidecar-session": "locked"}, messages=[{"role": "user", "content": "hi"}])
                shown = await asyncio.to_thread(cli, "status", "--port", proxy.url.rsplit(":", 1)[1])
    finally:
        await holder.close()
    assert reply.content[0].text == "ok"  # type: ignore[union-attr]
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("  !")]
    assert "could not take requests (1 went to the provider as the agent sent them, nothing stored" in line
    assert f"is locked by process {holder.process.pid}" in line  # type: ignore[union-attr]
