"""How the proxy records answers: the provider's usage is that of the prompt sent, and a stored answer is there for
any client as soon as the agent has it."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from sidecar.testing.provider import FakeProvider
from sidecar.testing.replies import Reply
from tests.helpers.proxy import reader, running_proxy

ASK = "Explain the parser module in detail. " * 110  # about 1,000 tokens
ANSWER = "The parser reads tokens one by one and keeps the last one. " * 270  # about 4,000 tokens


async def test_the_usage_reported_is_that_of_the_prompt_not_of_the_prompt_and_its_answer(tmp_path: Path) -> None:
    with FakeProvider() as fake:
        fake.script(Reply(text=ANSWER))
        async with running_proxy(tmp_path, fake.url) as proxy:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=proxy.url, max_retries=0)
            await client.messages.create(model="claude-sonnet-4-5", max_tokens=5000,
                                         messages=[{"role": "user", "content": ASK}],
                                         extra_headers={"x-context-sidecar-session": "calibrated"})
            async with reader(proxy.db) as sidecar:
                usage = await sidecar.usage("calibrated")
                listed = {s.session_id: s.messages for s in (await sidecar.sessions()).sessions}
    reported = fake.model_requests[0]
    assert listed == {"calibrated": 2}  # the answer is stored
    # The provider counted about the ask's tokens; taken against the ask and the answer, the sidecar would think
    # its own estimates five times too high (calibration 0.2, halved towards it).
    assert usage.calibration == pytest.approx(1.0, abs=0.2), (usage, reported.body)
