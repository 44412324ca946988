/**
 * Typed requests to the sidecar over any JSON-RPC connection: the LanguageClient in
 * VS Code, or a bare vscode-jsonrpc MessageConnection in tests.
 */
import { CancellationToken, Disposable, NotificationHandler, ProgressToken, ProgressType } from 'vscode-jsonrpc';
import {
  CompactParams,
  CompactResult,
  ExpandResult,
  FollowResult,
  IngestResult,
  Message,
  Methods,
  SessionInfo,
  SessionsResult,
  Usage,
  WatchParams,
  WatchResult,
} from './protocol';

/** What both `LanguageClient` and `MessageConnection` offer. */
export interface RpcConnection {
  sendRequest<R>(method: string, params: unknown, token?: CancellationToken): Promise<R>;
  sendNotification(method: string, params?: unknown): Promise<void>;
  onNotification(method: string, handler: (params: any) => void): Disposable;
  onProgress<P>(type: ProgressType<P>, token: ProgressToken, handler: NotificationHandler<P>): Disposable;
}

/** LSP `WorkDoneProgressBegin | Report | End`, as sent on a `workDoneToken`. */
export interface WorkDoneProgress {
  kind: 'begin' | 'report' | 'end';
  title?: string;
  message?: string;
  percentage?: number;
  cancellable?: boolean;
}

export const workDoneProgressType = new ProgressType<WorkDoneProgress>();

let tokenCounter = 0;

/** A workDoneToken unique within this process. */
export function newWorkDoneToken(): string {
  tokenCounter += 1;
  return `contextSidecar/compact/${process.pid}/${tokenCounter}`;
}

export interface CompactOptions {
  onProgress?: (progress: WorkDoneProgress) => void;
  token?: CancellationToken;
}

export class SidecarRequests {
  constructor(private readonly rpc: RpcConnection) {}

  /** Any request, e.g. `memory/ingest` from an agent extension that shares this server. */
  send<R>(method: string, params: unknown, token?: CancellationToken): Promise<R> {
    // Both clients take trailing arguments as positional params: an explicit `undefined`
    // token would turn `params` into `[params, null]`.
    return token ? this.rpc.sendRequest<R>(method, params, token) : this.rpc.sendRequest<R>(method, params);
  }

  usage(sessionId: string): Promise<Usage> {
    return this.send<Usage>(Methods.CONTEXT_USAGE, { sessionId });
  }

  /** Stored sessions; with `workspace`, only those of that folder. */
  async sessions(workspace?: string): Promise<SessionInfo[]> {
    const result = await this.send<SessionsResult>(Methods.MEMORY_SESSIONS, workspace === undefined ? {} : { workspace });
    return result.sessions;
  }

  /** `context/follow`: usage and compactions of the session, or of every session of the workspace, reach this connection. */
  follow(params: { sessionId?: string; workspace?: string; follow: boolean }): Promise<FollowResult> {
    return this.send<FollowResult>(Methods.CONTEXT_FOLLOW, params);
  }

  /** `memory/watch`: the server follows the workspace's agent transcripts for as long as this connection lives. */
  watch(params: WatchParams): Promise<WatchResult> {
    return this.send<WatchResult>(Methods.MEMORY_WATCH, params);
  }

  ingest(sessionId: string, messages: Message[], session?: Record<string, unknown>): Promise<IngestResult> {
    return this.send<IngestResult>(Methods.MEMORY_INGEST, { sessionId, messages, session });
  }

  expand(sessionId: string, id: string, tokenCap?: number): Promise<ExpandResult> {
    return this.send<ExpandResult>(Methods.MEMORY_EXPAND, { sessionId, id, tokenCap });
  }

  /** `context/compact` with its progress on a fresh workDoneToken; cancelling `token` sends `$/cancelRequest`. */
  async compact(params: CompactParams, options: CompactOptions = {}): Promise<CompactResult> {
    const workDoneToken = newWorkDoneToken();
    const listener = options.onProgress
      ? this.rpc.onProgress(workDoneProgressType, workDoneToken, options.onProgress)
      : undefined;
    try {
      return await this.send<CompactResult>(Methods.CONTEXT_COMPACT, { ...params, workDoneToken }, options.token);
    } finally {
      listener?.dispose();
    }
  }
}
