/** Ties the client, the session selection and the status bar together. */
import * as vscode from 'vscode';
import { ResponseError } from 'vscode-jsonrpc';
import { SidecarClient } from './client';
import { DidCompactParams, ErrorCodes, Usage } from './protocol';
import { SidecarRequests } from './rpc';
import { SessionSelection } from './sessions';
import { formatTokens } from './status';
import { UsageStatusBar } from './statusBar';

export class SidecarController implements vscode.Disposable {
  readonly selection = new SessionSelection();
  readonly client: SidecarClient;
  private readonly statusBar = new UsageStatusBar();
  private readonly selectionListener: vscode.Disposable;

  constructor(private readonly output: vscode.OutputChannel) {
    this.client = new SidecarClient(output, {
      onUsage: (usage: Usage) => this.selection.notified(usage),
      onDidCompact: (params: DidCompactParams) => this.didCompact(params),
      onRunning: () => void this.refresh(),
    });
    this.selectionListener = this.selection.onDidChange((usage) =>
      this.statusBar.show(usage, this.selection.sessionId),
    );
  }

  /** The requests of the running server, or an error the user can act on. */
  requests(): SidecarRequests {
    const requests = this.client.requests;
    if (!requests) {
      throw new Error('context-sidecar is not running; run "Context Sidecar: Restart Server".');
    }
    return requests;
  }

  /** Re-reads the default session and the selected session's usage. */
  async refresh(): Promise<void> {
    const requests = this.client.requests;
    if (!requests) {
      return;
    }
    try {
      this.selection.adoptDefault(await requests.sessions());
      const sessionId = this.selection.sessionId;
      if (sessionId !== undefined) {
        const version = this.selection.version(sessionId);
        this.selection.updateFromReply(await requests.usage(sessionId), version);
      }
    } catch (error) {
      // A pinned session that has no messages yet is unknown to the server until its first ingest.
      if (!(error instanceof ResponseError && error.code === ErrorCodes.UNKNOWN_SESSION)) {
        this.output.appendLine(`Refreshing usage failed: ${String(error)}`);
      }
    }
  }

  async setSession(sessionId: string | undefined): Promise<void> {
    this.selection.pin(sessionId);
    await this.refresh();
  }

  private didCompact(params: DidCompactParams): void {
    if (params.sessionId === this.selection.sessionId) {
      vscode.window.setStatusBarMessage(
        `Context compacted (${params.trigger}): ${formatTokens(params.tokensBefore)} → ` +
          `${formatTokens(params.tokensAfter)} tokens`,
        8000,
      );
    }
  }

  dispose(): void {
    this.selectionListener.dispose();
    this.selection.dispose();
    this.statusBar.dispose();
    this.client.dispose();
  }
}
