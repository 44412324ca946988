/** Ties the client, the session selection and the status bar together. */
import * as vscode from 'vscode';
import { ResponseError } from 'vscode-jsonrpc';
import { SidecarClient } from './client';
import { DidCompactParams, ErrorCodes, Methods, SETTINGS_SECTION, Usage } from './protocol';
import { SidecarRequests } from './rpc';
import { SessionSelection } from './sessions';
import { agentEnv } from './settings';
import { formatTokens } from './status';
import { UsageStatusBar } from './statusBar';

export class SidecarController implements vscode.Disposable {
  readonly selection = new SessionSelection();
  readonly client: SidecarClient;
  private readonly statusBar = new UsageStatusBar();
  private readonly selectionListener: vscode.Disposable;
  /** The pinned session this connection follows by request. */
  private followedSession: string | undefined;
  /** The folder whose agent transcripts this connection has the server follow. */
  private watchedFolder: string | undefined;

  constructor(private readonly output: vscode.OutputChannel) {
    this.client = new SidecarClient(output, {
      onUsage: (usage: Usage) => this.selection.notified(usage),
      onDidCompact: (params: DidCompactParams) => this.didCompact(params),
      onRunning: () => {
        this.followedSession = undefined; // a new connection follows and watches nothing yet
        this.watchedFolder = undefined;
        void this.follow()
          .then(() => this.watchAgents())
          .then(() => this.followPinned())
          .then(() => this.refresh());
      },
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

  /**
   * The folder whose sessions the status bar follows: the first workspace folder, unless
   * `followWorkspace` is off or the server predates `context/follow`.
   */
  workspace(): string | undefined {
    const enabled = vscode.workspace.getConfiguration(SETTINGS_SECTION).get<boolean>('followWorkspace', true);
    const served = this.client.serverCapabilities?.methods?.includes(Methods.CONTEXT_FOLLOW) ?? false;
    return enabled && served ? vscode.workspace.workspaceFolders?.[0]?.uri.fsPath : undefined;
  }

  /**
   * `context/follow` the workspace folder, or stop following it when `followWorkspace` is off:
   * usage of its sessions then reaches the status bar whoever changes them (an agent on the same
   * database), and the server pushes the newest one's usage at once.
   */
  async follow(): Promise<void> {
    const requests = this.client.requests;
    const folder = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
    if (!requests || !folder || !this.client.serverCapabilities?.methods?.includes(Methods.CONTEXT_FOLLOW)) {
      return;
    }
    try {
      await requests.follow({ workspace: folder, follow: this.workspace() !== undefined });
    } catch (error) {
      this.output.appendLine(`Following the sessions of ${folder} failed: ${String(error)}`);
    }
  }

  /**
   * `memory/watch` the workspace folder (unless `watchAgents` is off): the server follows the transcripts
   * Claude Code, Codex and pi write for it, so their sessions show with no MCP server or hook running. The
   * transcripts are where the agents keep them for this window's environment.
   */
  async watchAgents(): Promise<void> {
    const requests = this.client.requests;
    const enabled = vscode.workspace.getConfiguration(SETTINGS_SECTION).get<boolean>('watchAgents', true);
    const served = this.client.serverCapabilities?.methods?.includes(Methods.MEMORY_WATCH) ?? false;
    const folder = enabled ? vscode.workspace.workspaceFolders?.[0]?.uri.fsPath : undefined;
    if (!requests || !served || folder === this.watchedFolder) {
      return;
    }
    const before = this.watchedFolder;
    this.watchedFolder = folder;
    try {
      if (before !== undefined) {
        await requests.watch({ workspace: before, watch: false });
      }
      if (folder !== undefined) {
        const result = await requests.watch({ workspace: folder, watch: true, env: agentEnv() });
        this.output.appendLine(
          `Following ${result.transcripts.length} agent transcripts of ${result.workspace}` +
            result.directories
              .filter((d) => d.problem)
              .map((d) => `; ${d.problem}`)
              .join(''),
        );
      }
    } catch (error) {
      this.watchedFolder = undefined;
      this.output.appendLine(`Following the agent transcripts of ${folder ?? before} failed: ${String(error)}`);
    }
  }

  /** Re-reads the default session (the newest of the followed workspace) and the selected session's usage. */
  async refresh(): Promise<void> {
    const requests = this.client.requests;
    if (!requests) {
      return;
    }
    try {
      this.selection.adoptDefault(await requests.sessions(this.workspace()));
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
    await this.followPinned();
    await this.refresh();
  }

  /**
   * `context/follow` the pinned session, of any workspace, so that an agent's changes to it arrive
   * too; stops following the one pinned before.
   */
  private async followPinned(): Promise<void> {
    const requests = this.client.requests;
    const sessionId = this.selection.pinned ? this.selection.sessionId : undefined;
    const served = this.client.serverCapabilities?.methods?.includes(Methods.CONTEXT_FOLLOW) ?? false;
    if (!requests || !served || sessionId === this.followedSession) {
      return;
    }
    const before = this.followedSession;
    this.followedSession = sessionId;
    try {
      if (before !== undefined) {
        await requests.follow({ sessionId: before, follow: false });
      }
      if (sessionId !== undefined) {
        await requests.follow({ sessionId, follow: true });
      }
    } catch (error) {
      this.followedSession = undefined;
      // A session with no messages yet is unknown; this connection follows it once it ingests into it.
      if (!(error instanceof ResponseError && error.code === ErrorCodes.UNKNOWN_SESSION)) {
        this.output.appendLine(`Following session ${sessionId} failed: ${String(error)}`);
      }
    }
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

