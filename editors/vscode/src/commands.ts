/** The `contextSidecar.*` commands. */
import * as vscode from 'vscode';
import { CancellationToken, ResponseError } from 'vscode-jsonrpc';
import { SidecarController } from './controller';
import { renderExpansion, renderSessions } from './documents';
import { CompactResult, ErrorCodes } from './protocol';
import { ReadonlyDocuments } from './readonlyDocuments';
import { formatTokens, statusTooltip } from './status';

export function registerCommands(sidecar: SidecarController, documents: ReadonlyDocuments): vscode.Disposable[] {
  const register = (id: string, run: (...args: any[]) => Promise<unknown>) =>
    vscode.commands.registerCommand(id, async (...args: any[]) => {
      try {
        return await run(...args);
      } catch (error) {
        void vscode.window.showErrorMessage(`Context Sidecar: ${describeError(error)}`);
        return undefined;
      }
    });
  return [
    register('contextSidecar.compact', (focus?: string) => compact(sidecar, focus)),
    register('contextSidecar.showUsage', () => showUsage(sidecar)),
    register('contextSidecar.listSessions', () => listSessions(sidecar, documents)),
    register('contextSidecar.expandSummary', (id?: string) => expandSummary(sidecar, documents, id)),
    register('contextSidecar.selectSession', (id?: string) => selectSession(sidecar, id)),
    register('contextSidecar.restart', () => sidecar.client.restart()),
  ];
}

function describeError(error: unknown): string {
  if (error instanceof ResponseError) {
    return `${error.message} (${error.code})`;
  }
  return error instanceof Error ? error.message : String(error);
}

function selectedSession(sidecar: SidecarController): string {
  const sessionId = sidecar.selection.sessionId;
  if (sessionId === undefined) {
    throw new Error('no session yet: an agent has to ingest messages first');
  }
  return sessionId;
}

async function compact(sidecar: SidecarController, focusArg?: string): Promise<CompactResult | undefined> {
  const sessionId = selectedSession(sidecar);
  const requests = sidecar.requests();
  const focus =
    typeof focusArg === 'string'
      ? focusArg
      : await vscode.window.showInputBox({
          title: 'Compact Context',
          prompt: `Compact session ${sessionId}. Optionally, what should the summary focus on?`,
          placeHolder: 'e.g. the failing tests and the files changed (leave empty for none)',
        });
  if (focus === undefined) {
    return undefined;
  }
  try {
    const result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'Compacting context', cancellable: true },
      (progress, token) =>
        requests.compact(
          { sessionId, focus: focus.trim() || undefined },
          {
            token: token as CancellationToken,
            onProgress: (step) => {
              if (step.kind !== 'end') {
                progress.report({ message: step.message });
              }
            },
          },
        ),
    );
    const message = result.compacted
      ? `Context compacted: ${formatTokens(result.tokensBefore)} → ${formatTokens(result.tokensAfter)} tokens.`
      : `Nothing compacted: ${result.reason ?? 'nothing to compact'}.`;
    void vscode.window.showInformationMessage(message);
    return result;
  } catch (error) {
    if (error instanceof ResponseError && error.code === ErrorCodes.REQUEST_CANCELLED) {
      void vscode.window.showInformationMessage('Compaction cancelled; the session is unchanged.');
      return undefined;
    }
    throw error;
  }
}

async function showUsage(sidecar: SidecarController): Promise<void> {
  const sessionId = selectedSession(sidecar);
  const version = sidecar.selection.version(sessionId);
  const usage = await sidecar.requests().usage(sessionId);
  sidecar.selection.updateFromReply(usage, version);
  const choice = await vscode.window.showInformationMessage(
    statusTooltip(usage, sessionId).split('\n').join(' · '),
    'Compact…',
    'Sessions…',
  );
  if (choice === 'Compact…') {
    await vscode.commands.executeCommand('contextSidecar.compact');
  } else if (choice === 'Sessions…') {
    await vscode.commands.executeCommand('contextSidecar.selectSession');
  }
}

async function listSessions(sidecar: SidecarController, documents: ReadonlyDocuments): Promise<void> {
  const requests = sidecar.requests();
  await documents.open('/sessions.md', async () =>
    renderSessions(await requests.sessions(), sidecar.selection.sessionId),
  );
}

async function expandSummary(sidecar: SidecarController, documents: ReadonlyDocuments, idArg?: string): Promise<void> {
  const sessionId = selectedSession(sidecar);
  const id =
    typeof idArg === 'string'
      ? idArg
      : await vscode.window.showInputBox({
          title: 'Expand Summary',
          prompt: `Id of a summary or pruned message in session ${sessionId}`,
          placeHolder: 'the id="…" of a <summary> tag',
        });
  if (!id?.trim()) {
    return;
  }
  const result = await sidecar.requests().expand(sessionId, id.trim());
  const text = renderExpansion(sessionId, result);
  await documents.open(`/expand/${encodeURIComponent(sessionId)}/${encodeURIComponent(result.id)}.md`, async () => text);
}

interface SessionPick extends vscode.QuickPickItem {
  sessionId: string | undefined;
}

async function selectSession(sidecar: SidecarController, idArg?: string): Promise<void> {
  if (typeof idArg === 'string') {
    await sidecar.setSession(idArg);
    return;
  }
  const sessions = await sidecar.requests().sessions();
  const newestFirst = [...sessions].sort((a, b) => Date.parse(b.updatedAt) - Date.parse(a.updatedAt));
  const items: SessionPick[] = [
    {
      label: '$(history) Follow the most recently updated session',
      sessionId: undefined,
      picked: !sidecar.selection.pinned,
    },
    ...newestFirst.map((s) => ({
      label: s.title ? `${s.title}` : s.sessionId,
      description: s.title ? s.sessionId : undefined,
      detail: `${formatTokens(s.tokens)} tokens · ${s.messages} messages · ${s.summaries} summaries · updated ${s.updatedAt}`,
      sessionId: s.sessionId,
      picked: sidecar.selection.pinned && s.sessionId === sidecar.selection.sessionId,
    })),
  ];
  const choice = await vscode.window.showQuickPick(items, { title: 'Context Sidecar: Select Session' });
  if (choice) {
    await sidecar.setSession(choice.sessionId);
  }
}
