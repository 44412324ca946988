"""``python -m sidecar.testing.standin``: the stand-in model the README's agent runs against offline."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import openai


def test_it_serves_until_interrupted_and_says_where() -> None:
    process = subprocess.Popen([sys.executable, "-m", "sidecar.testing.standin", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        base_url = line.split(" on ")[1].split()[0]
        llm = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        tools = [{"type": "function", "function": {"name": "memory_grep", "parameters": {"type": "object"}}}]
        asked = llm.chat.completions.create(model="standin", tools=tools,  # type: ignore[list-item]
                                            messages=[{"role": "user", "content": "Where is the tokenizer?"}])
        call = asked.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert (call.function.name, call.function.arguments) == ("memory_grep", '{"pattern": "tokenizer"}')
        result = "memory_grep \"tokenizer\": 1 match\n1. message m1 (user)\n   the tokenizer lives in lex.py\n"
        answer = llm.chat.completions.create(model="standin", messages=[
            {"role": "user", "content": "Where is the tokenizer?"},
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": result}])
        assert answer.choices[0].message.content == "From memory: the tokenizer lives in lex.py (message m1)"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_a_port_in_use_is_one_clear_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        run = subprocess.run([sys.executable, "-m", "sidecar.testing.standin", "--port", str(taken.getsockname()[1])],
                             capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert run.stderr.startswith("cannot listen on 127.0.0.1:") and "Traceback" not in run.stderr
