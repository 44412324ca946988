import asyncio
import os

import openai

from sidecar.client import SidecarClient


async def main() -> None:
    llm, model = openai.AsyncOpenAI(), os.environ.get("OPENAI_MODEL", "gpt-4o-mini")  # OPENAI_API_KEY, _BASE_URL
    settings = {"compaction": {"freshTail": 4, "leafChunkSize": 4}}  # small, so that this short session compacts
    async with await SidecarClient.spawn(settings=settings) as sidecar:
        session = f"first-agent-{os.getpid()}"  # a Codex session to go on with, from the repository's test fixtures
        await sidecar.import_transcript("tests/fixtures/codex-0.46-rollout.jsonl", session_id=session)
        compacted = await sidecar.compact(session)  # older messages become a summary; nothing is lost
        print(f"compacted: {compacted.tokens_before} -> {compacted.tokens_after} tokens")
        await sidecar.ingest(session, [{"role": "user", "content": "Which cart test failed before the fix?"}])
        tools = await sidecar.tools(session)  # memory_grep, memory_describe, memory_expand, memory_query
        for round_number in range(8):  # a round limit: the last call offers no tools, so the model answers
            context = await sidecar.assemble(session)  # the next call's messages, within the window
            offer = {"tools": tools} if round_number < 7 else {}
            response = await llm.chat.completions.create(model=model, messages=context.messages, **offer)
            message = response.choices[0].message
            await sidecar.ingest(session, [message.model_dump(include={"role", "content", "tool_calls"},
                                                              exclude_none=True)])  # no `refusal: null`
            if not message.tool_calls:
                break
            for call in message.tool_calls:  # the model searches and opens what was compacted
                print("tool call:", call.function.name, call.function.arguments)
                await sidecar.ingest(session, [await sidecar.call_tool(session, call.function.name,
                                                                       call.function.arguments, call.id)])
        print("assistant:", message.content)
        summary = await sidecar.expand(session, compacted.summary_ids[0])  # the summary's sources, verbatim
        print("summary sources:", ", ".join(f"{item.message['role']} {item.tokens}" for item in summary.items))


asyncio.run(main())
