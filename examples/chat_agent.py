"""A minimal chat agent whose history lives in context-sidecar; talks to any OpenAI-compatible endpoint.

Each turn: ingest the user message, assemble the context, call the model with the sidecar's memory tools,
run the tool calls it makes through the sidecar (it can search and open compacted history) until it answers,
ingest everything, report the provider's usage, show how full the context is. Type ``/compact [focus]`` to
compact, ``/usage``, ``/quit``.

    OPENAI_API_KEY=sk-... python examples/chat_agent.py --model gpt-4o-mini
    python examples/chat_agent.py --base-url http://localhost:11434/v1 --model llama3.2   # Ollama, no key
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import openai

from protocol.types import DidCompactParams, Usage
from sidecar.client import SidecarClient, SidecarRequestError

SYSTEM_PROMPT = "You are a concise, helpful assistant."
NO_KEY = "no-key-needed"
MAX_TOOL_ROUNDS = 8
"""Model calls per turn at most: a model that keeps calling tools gets a final call without them."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"),
                        help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1 (default: $OPENAI_BASE_URL, "
                             "else api.openai.com); the key is read from $OPENAI_API_KEY")
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                        help="chat model (default: $OPENAI_MODEL, else gpt-4o-mini)")
    parser.add_argument("--session", default=f"chat-{time.strftime('%Y%m%d-%H%M%S')}",
                        help="session id; reuse one to continue that conversation (default: a new one)")
    parser.add_argument("--db", help="sidecar DuckDB file (default: the sidecar's per-user database)")
    parser.add_argument("--context-window", type=int,
                        help="the model's context window, if the sidecar's model table does not know it")
    parser.add_argument("--summarizer", choices=["model", "deterministic"], default="model",
                        help="who writes compaction summaries: the same endpoint and model (default), or the "
                             "sidecar's offline deterministic summarizer")
    parser.add_argument("--settings", type=json.loads, default={}, metavar="JSON",
                        help='extra sidecar settings, e.g. \'{"compaction": {"freshTail": 8}}\'')
    return parser.parse_args(argv)


def sidecar_settings(args: argparse.Namespace) -> dict[str, Any]:
    """initializationOptions: the extra settings, plus the summarizer endpoint unless told to stay offline."""
    settings = dict(args.settings)
    if args.summarizer == "model":
        # The sidecar reads the key from the same environment variable; it never receives the key itself.
        settings["llm"] = {"baseUrl": args.base_url, "model": args.model, "apiKeyEnv": "OPENAI_API_KEY",
                           **settings.get("llm", {})}
    return settings


def show_usage(usage: Usage) -> None:
    """One status line, as an editor's status bar would show it."""
    hint = f" — {usage.hint}" if usage.hint else ""
    print(f"[context: {usage.tokens:,} tokens of {usage.context_window:,} ({usage.percent:.1f}%), "
          f"{usage.state}, {usage.source}{hint}]", flush=True)


def show_compaction(event: DidCompactParams) -> None:
    """Announce every compaction, manual or automatic."""
    print(f"[{event.trigger} {event.mode} compaction: {event.tokens_before:,} -> {event.tokens_after:,} tokens]",
          flush=True)


class ChatAgent:
    """The chat loop: the sidecar keeps the history, the model only ever sees what the sidecar assembles."""

    def __init__(self, sidecar: SidecarClient, llm: openai.AsyncOpenAI, args: argparse.Namespace) -> None:
        self.sidecar = sidecar
        self.llm = llm
        self.model = args.model
        self.session_id = args.session
        self.session_info: dict[str, Any] | None = {"model": args.model, "title": "chat_agent.py",
                                                    "contextWindow": args.context_window}

    async def turn(self, text: str) -> None:
        """One user message in; the model's tool calls run through the sidecar until it replies."""
        await self.ingest({"role": "user", "content": text})
        tools = await self.sidecar.tools(self.session_id)  # constant: the prompt cache keeps them
        for round_number in range(MAX_TOOL_ROUNDS):
            assembled = await self.sidecar.assemble(self.session_id)
            # The system prompt is the agent's, not history: it is sent every call and never compacted.
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, *assembled.messages]
            offer = {"tools": tools} if round_number + 1 < MAX_TOOL_ROUNDS else {}
            response = await self.llm.chat.completions.create(model=self.model, messages=messages,  # type: ignore
                                                              **offer)
            message = response.choices[0].message
            if not message.tool_calls:
                reply = message.content or ""
                print(f"assistant: {reply}", flush=True)
                await self.ingest({"role": "assistant", "content": reply})
                await self.report(response)  # the provider counted the context that ends with this reply
                break
            await self.ingest(message.model_dump(include={"role", "content", "tool_calls"}))
            await self.report(response)
            for call in message.tool_calls:
                print(f"[tool {call.function.name} {call.function.arguments}]", flush=True)
                result = await self.sidecar.call_tool(self.session_id, call.function.name, call.function.arguments,
                                                      call.id)
                await self.ingest(result)
        show_usage(await self.sidecar.usage(self.session_id))

    async def report(self, response: Any) -> None:
        """Tell the sidecar what the provider counted for the last call."""
        if response.usage is not None:
            details = response.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details else 0
            await self.sidecar.report_usage(self.session_id, response.usage.prompt_tokens - cached,
                                            response.usage.completion_tokens, cache_read_tokens=cached)

    async def ingest(self, message: dict[str, Any]) -> None:
        """Store one message; the first one also names the model and window of the session."""
        info = {k: v for k, v in (self.session_info or {}).items() if v is not None}
        await self.sidecar.ingest(self.session_id, [message], session=info or None)
        self.session_info = None

    async def compact(self, focus: str | None) -> None:
        """``/compact [focus]``."""
        result = await self.sidecar.compact(self.session_id, focus=focus)
        if not result.compacted:
            print(f"[nothing compacted: {result.reason}]", flush=True)
        show_usage(result.usage)

    async def command(self, line: str) -> bool:
        """Handle one input line; False ends the loop."""
        if line in ("/quit", "/exit"):
            return False
        if line == "/compact" or line.startswith("/compact "):
            await self.compact(line.removeprefix("/compact").strip() or None)
        elif line == "/usage":
            show_usage(await self.sidecar.usage(self.session_id))
        elif line:
            await self.turn(line)
        return True


async def run(args: argparse.Namespace) -> int:
    """Spawn the sidecar, then chat until /quit or end of input."""
    api_key = os.environ.get("OPENAI_API_KEY") or (NO_KEY if args.base_url else None)
    if api_key is None:
        print("Set OPENAI_API_KEY, or --base-url for an endpoint that needs no key.", file=sys.stderr)
        return 2
    llm = openai.AsyncOpenAI(api_key=api_key, base_url=args.base_url, max_retries=1)
    sidecar = await SidecarClient.spawn(command=[sys.executable, "-m", "sidecar"], db=args.db,
                                        settings=sidecar_settings(args))
    sidecar.on_compact(show_compaction)
    agent = ChatAgent(sidecar, llm, args)
    print(f"session {args.session} on {args.base_url or 'api.openai.com'} ({args.model}); "
          f"summaries by {sidecar.capabilities.get('summarizer')}; /compact [focus], /usage, /quit", flush=True)
    try:
        while True:
            print("> ", end="", flush=True)
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            try:
                if not await agent.command(line.strip()):
                    break
            except (SidecarRequestError, openai.OpenAIError) as error:
                print(f"[error: {error}]", flush=True)
    finally:
        await sidecar.close()
        await llm.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
