/** Markdown shown in the extension's read-only documents; no `vscode` import. */
import { ExpandResult, Message, MessageContentPart, SessionInfo } from './protocol';

export function messageText(message: Message): string {
  const parts: string[] = [];
  if (typeof message.content === 'string') {
    parts.push(message.content);
  } else if (Array.isArray(message.content)) {
    parts.push(
      ...message.content.map((part: MessageContentPart) => (part.type === 'text' ? part.text ?? '' : `[${part.type}]`)),
    );
  }
  for (const call of message.tool_calls ?? []) {
    parts.push(`→ ${call.function.name}(${call.function.arguments})`);
  }
  return parts.join('\n');
}

export function renderExpansion(sessionId: string, result: ExpandResult): string {
  const lines = [`# ${result.kind} ${result.id}`, '', `Session \`${sessionId}\`, ${result.items.length} items.`, ''];
  for (const item of result.items) {
    const role = item.message ? ` ${item.message.role}` : '';
    const tool = item.message?.tool_call_id ? ` (result of ${item.message.tool_call_id})` : '';
    lines.push(`## ${item.kind}${role} ${item.id}${tool} · ${item.tokens} tokens`, '');
    lines.push(item.message ? messageText(item.message) : item.summary ?? '', '');
  }
  if (result.truncated) {
    lines.push('_Truncated at the token cap._', '');
  }
  return lines.join('\n');
}

export function renderSessions(sessions: readonly SessionInfo[], selected: string | undefined): string {
  const lines = ['# Context Sidecar sessions', ''];
  if (sessions.length === 0) {
    lines.push('No sessions stored yet.');
    return lines.join('\n');
  }
  lines.push('| | session | title | messages | summaries | tokens | updated |', '|---|---|---|---:|---:|---:|---|');
  const newestFirst = [...sessions].sort((a, b) => Date.parse(b.updatedAt) - Date.parse(a.updatedAt));
  for (const s of newestFirst) {
    const mark = s.sessionId === selected ? '●' : '';
    const title = (s.title ?? '').replace(/\|/g, '\\|');
    lines.push(`| ${mark} | \`${s.sessionId}\` | ${title} | ${s.messages} | ${s.summaries} | ${s.tokens} | ${s.updatedAt} |`);
  }
  return lines.join('\n');
}
