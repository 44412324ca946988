"""The agent never waits on the sidecar longer than it must: not for an answer's recording to reach a busy sidecar,
not for a compaction another request of its conversation is stuck in, not for a sidecar that cannot be restarted."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply
from tests.helpers.hosts import WAIT as HOST_WAIT
from tests.helpers.hosts import host_pid, short_runtime, sock_of
from tests.helpers.proxy import WAIT, children, reader, running_proxy, stuck_in_a_compaction, until_dead

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def stored(db: Path, session: str, text: str) -> int:
    """Messages of ``session`` holding ``text``, once the host has them (waited for)."""
    async with reader(db) as sidecar, asyncio.timeout(HOST_WAIT):
        while not (found := await sidecar.grep(session, text, scope="messages")).matches:
            await asyncio.sleep(0.1)
    return len(found.matches)


async def test_an_answer_reaches_the_agent_whole_while_the_sidecar_does_not_read(tmp_path: Path) -> None:
    big = "<<big answer>> " + "the parser keeps the last token. " * 120_000  # ~4 MB: more than a pipe holds
    with FakeProvider() as fake:
        fake.script(Reply(text="first"), Reply(text=big))
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0, timeout=WAIT)
            headers = {"x-context-sidecar-session": "busy"}
            history: list[dict[str, Any]] = [user("<<one>> read the parser")]
            await client.messages.create(model="m", max_tokens=5, messages=history, extra_headers=headers)
            assert await stored(proxy.db, "busy", "first") == 1
            [sidecar] = children(proxy.process.pid)
            os.kill(sidecar, signal.SIGSTOP)  # reads nothing until it is continued
            try:
                history += [{"role": "assistant", "content": "first"}, user("<<two>> and now?")]
                reply = await asyncio.wait_for(client.messages.create(
                    model="m", max_tokens=5, messages=history, extra_headers=headers), WAIT)
            finally:
                os.kill(sidecar, signal.SIGCONT)
            assert await stored(proxy.db, "busy", "<<big answer>>") == 1  # and it is stored once the sidecar reads
            log = proxy.log_text()
    assert reply.content[0].text == big  # type: ignore[union-attr]
    assert "forwarded as the agent sent it" not in log  # sent ahead: the request itself did not wait either


async def test_requests_of_a_conversation_stuck_in_a_compaction_wait_for_no_one_but_the_first(tmp_path: Path) -> None:
    async with stuck_in_a_compaction(tmp_path, prepare_timeout=2) as stuck:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=stuck.proxy.url, max_retries=0, timeout=WAIT)

        async def ask() -> Any:
            return await client.messages.create(model="m", max_tokens=5, messages=stuck.history,
                                                extra_headers={"x-context-sidecar-session": "stuck"})

        together = await asyncio.gather(ask(), ask())  # one holds the conversation, the other waits for it
        later = await ask()  # the compaction still hangs
        await asyncio.to_thread(stuck.summarizer.wait_for)
        log = stuck.proxy.log_text()
    assert [reply.content[0].text for reply in [*together, later]] == ["answered"] * 3
    assert log.count("forwarded as the agent sent it: the sidecar took over 2s") == 1
    assert log.count("forwarded as the agent sent it: an earlier request of the conversation is still at the "
                     "sidecar") == 2  # the one that waited gave up with the first; the later one waited not at all


async def test_a_sidecar_that_cannot_be_started_again_is_not_tried_by_every_request(tmp_path: Path) -> None:
    with short_runtime() as runtime, FakeProvider(responder=lambda request: "ok") as fake:
        async with running_proxy(tmp_path, fake.url, env={"XDG_RUNTIME_DIR": str(runtime)}) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0, timeout=WAIT)
            headers = {"x-context-sidecar-session": "orphaned"}
            history: list[dict[str, Any]] = [user("<<first>>")]
            await client.messages.create(model="m", max_tokens=5, messages=history, extra_headers=headers)
            host = host_pid(sock_of(runtime, proxy.db))
            os.kill(host, signal.SIGKILL)
            [sidecar] = children(proxy.process.pid)
            os.kill(sidecar, signal.SIGKILL)
            await until_dead(host)
            await until_dead(sidecar)  # else the next request may still reach it, managed
            shutil.rmtree(runtime / "context-sidecar")
            (runtime / "context-sidecar").write_text("")  # no host can be reached or started any more
            replies = []
            for turn in ("second", "third"):
                history += [{"role": "assistant", "content": "ok"}, user(f"<<{turn}>>")]
                replies.append(await client.messages.create(model="m", max_tokens=5, messages=history,
                                                            extra_headers=headers))
            stats = httpx2.get(f"{proxy.url}/stats", timeout=WAIT).json()
            log = proxy.log_text()
    assert [reply.content[0].text for reply in replies] == ["ok", "ok"]  # type: ignore[union-attr]
    assert log.count("the sidecar process is gone: starting another") == 1, log  # the third did not try again
    assert "the sidecar could not be started again (" in log and "next attempt in 5 s" in log
    session = next(s for s in stats["sessions"] if s["sessionId"] == "orphaned")
    assert session["unmanaged"] == 2 and stats["problem"]["requests"] == 2
    assert "could not be started again" in stats["problem"]["message"]
