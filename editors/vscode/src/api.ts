/** What `activate()` returns, for agent extensions: `vscode.extensions.getExtension(...).exports`. */
import type { CancellationToken, Event } from 'vscode-jsonrpc';
import type { SidecarController } from './controller';
import type { Usage } from './protocol';

export interface ContextSidecarApi {
  /** Show this session; `undefined` goes back to the most recently updated one. */
  setSession(sessionId: string | undefined): Promise<void>;
  /** The selected session's id, if any. */
  getSession(): string | undefined;
  /** The selected session's latest usage, if known. */
  getUsage(): Usage | undefined;
  /** Fires when the selected session's usage or the selection changes. */
  onDidChangeUsage: Event<Usage | undefined>;
  /**
   * Send any protocol request through this extension's server, e.g. `memory/ingest` or
   * `context/assemble`. An agent may as well spawn its own context-sidecar on the same
   * database: it relays to the same host, and the status bar follows its sessions of this
   * workspace folder.
   */
  sendRequest<R>(method: string, params: unknown, token?: CancellationToken): Promise<R>;
}

export function createApi(sidecar: SidecarController): ContextSidecarApi {
  return {
    setSession: (sessionId) => sidecar.setSession(sessionId),
    getSession: () => sidecar.selection.sessionId,
    getUsage: () => sidecar.selection.usage,
    onDidChangeUsage: sidecar.selection.onDidChange,
    sendRequest: (method, params, token) => sidecar.requests().send(method, params, token),
  };
}
