"""The refusing proxy records and refuses CONNECT and absolute-URL requests; local traffic goes around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sidecar.testing import FakeProvider
from sidecar.testing.refusing_proxy import RefusingProxy


def opener(proxy: RefusingProxy) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({"https": proxy.url, "http": proxy.url}))


def test_https_and_http_requests_are_refused_and_recorded(tmp_path: Path) -> None:
    with RefusingProxy(log=tmp_path / "attempts.jsonl") as proxy:
        with pytest.raises(urllib.error.URLError, match="403"):
            opener(proxy).open("https://api.anthropic.com/v1/messages", timeout=10)
        with pytest.raises(urllib.error.HTTPError) as caught:
            opener(proxy).open(urllib.request.Request("http://example.com/telemetry", data=b"{}"), timeout=10)
        assert caught.value.code == 403
        attempts = proxy.attempts
    assert [(a.method, a.target) for a in attempts] == [("CONNECT", "api.anthropic.com:443"),
                                                        ("POST", "http://example.com/telemetry")]
    logged = [json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert [e["target"] for e in logged] == ["api.anthropic.com:443", "http://example.com/telemetry"]


def test_its_env_keeps_local_servers_direct() -> None:
    with RefusingProxy() as proxy, FakeProvider() as fake:
        code = ("import urllib.request, sys; "
                "print(urllib.request.urlopen(sys.argv[1] + '/models', timeout=10).status)")
        env = {**os.environ, **proxy.env()}
        result = subprocess.run([sys.executable, "-c", code, fake.base_url], env=env, capture_output=True,
                                text=True, timeout=30, check=True)
        assert result.stdout.strip() == "200"
        assert proxy.attempts == [] and [r.path for r in fake.requests] == ["/v1/models"]
