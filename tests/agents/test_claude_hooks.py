"""Claude Code's own ``/compact`` with the hooks ``setup claude-code`` installs: the session's rules come back.

The fake model answers Claude Code's summarization request with a summary that names no rule, so only the
SessionStart hook can put the rule into the conversation after the compaction; a control run without setup
shows that Claude Code alone does not.
"""

from __future__ import annotations

import asyncio
import json

from sidecar.client import SidecarClient
from sidecar.testing import RecordedRequest, Reply
from tests.agents.runners import Claude
from tests.agents.world import AgentRun, AgentWorld

RULE = "You must run `make check` before every commit."
FIRST = f"Fix the cart total in src/cart.py. {RULE}"
SUMMARY = "The user and the assistant are fixing the cart total; the work is half done."
SUMMARIZE = "CRITICAL: Respond with TEXT ONLY"
"""How Claude Code 2.1's summarization request begins its last user block."""


def summarize_or_chat(request: RecordedRequest) -> Reply:
    """The compaction request gets ``SUMMARY``; everything else a short answer."""
    return Reply(text=SUMMARY if SUMMARIZE in request.last_user_text else "Noted.")


def through_compaction(claude: Claude) -> tuple[str, AgentRun, AgentRun]:
    """A three-turn session, Claude Code's own ``/compact``, one more turn: (session, compaction run, last run)."""
    session = claude.run(FIRST).check().output["session_id"]
    for prompt in ("Show me the failing test.", "Go on with the fix."):
        claude.run(prompt, resume=session).check()
    compacted = claude.run("/compact", resume=session).check()
    assert any(SUMMARIZE in request.last_user_text for request in compacted.requests), "Claude Code compacted"
    after = claude.run("What is left to do?", resume=session).check()
    return session, compacted, after


def sent(run: AgentRun) -> str:
    """Everything the run's first model request carried."""
    return json.dumps(run.requests[0].body)


def setup(world: AgentWorld) -> AgentRun:
    return world.run([world.sidecar, "setup", "claude-code"]).check()


def test_rules_given_in_the_first_turn_survive_claude_codes_compaction_and_its_summary_is_stored(
        claude: Claude, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = summarize_or_chat
    assert "added the hooks PreCompact, SessionStart (compact), PostCompact" in setup(agent_world).stdout
    session, _, after = through_compaction(claude)
    carried = sent(after)
    assert "Fix the cart total" not in carried, "the first turn itself was compacted away"
    assert "[context-sidecar] Carried over from before this conversation was compacted" in carried
    assert f"- {RULE}" in carried, "the hook's note carries the rule"
    log = (agent_world.xdg["XDG_STATE_HOME"] / "context-sidecar" / "log" / "hook.log").read_text()
    assert f"PreCompact: session {session}:" in log and f"SessionStart: session {session}: restored 1 rules" in log
    assert f"PostCompact: session {session}: Claude Code's summary recorded" in log

    async def stored() -> list[str]:
        async with await SidecarClient.spawn(env=agent_world.env(), timeout=60) as client:
            found = await client.grep(session, "fixing the cart total", scope="summaries")
            return [(await client.describe(session, match.id)).content for match in found.matches]

    assert any(SUMMARY in str(content) for content in asyncio.run(stored())), "Claude Code's summary is stored"


def test_without_setup_claude_codes_compaction_drops_the_rules(claude: Claude, agent_world: AgentWorld) -> None:
    agent_world.provider.responder = summarize_or_chat
    _, _, after = through_compaction(claude)
    carried = sent(after)
    assert SUMMARY in carried, "Claude Code's own summary is there"
    assert RULE not in carried and "[context-sidecar]" not in carried
