/** Starting, restarting and stopping the sidecar through vscode-languageclient. */
import * as vscode from 'vscode';
import {
  CloseAction,
  CloseHandlerResult,
  ErrorAction,
  ErrorHandler,
  ErrorHandlerResult,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
  StaticFeature,
  TransportKind,
} from 'vscode-languageclient/node';
import { DidCompactParams, EXPERIMENTAL_KEY, Methods, ServerCapabilities, SETTINGS_SECTION, Usage } from './protocol';
import { RestartLimiter } from './restart';
import { SidecarRequests } from './rpc';
import { protocolSettings, serverLaunch, ServerLaunch } from './settings';

const CLIENT_ID = 'contextSidecar';
const CLIENT_NAME = 'Context Sidecar';

/** The Settings object to send: only values the user set, in any scope. */
export function currentProtocolSettings(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration(SETTINGS_SECTION);
  return protocolSettings((key) => {
    const seen = config.inspect(key);
    return seen?.workspaceFolderValue ?? seen?.workspaceValue ?? seen?.globalValue;
  });
}

export function currentServerLaunch(): ServerLaunch {
  const config = vscode.workspace.getConfiguration(SETTINGS_SECTION);
  return serverLaunch(config.get('serverCommand'), config.get('serverArgs'));
}

/** Declares `usageNotifications` and remembers the server's `contextSidecar` capabilities. */
class SidecarCapabilities implements StaticFeature {
  server: ServerCapabilities | undefined;

  fillClientCapabilities(capabilities: { experimental?: unknown }): void {
    const experimental = (capabilities.experimental ?? {}) as Record<string, unknown>;
    experimental[EXPERIMENTAL_KEY] = { usageNotifications: true, compactionHooks: false };
    capabilities.experimental = experimental;
  }

  initialize(capabilities: { experimental?: unknown }): void {
    const experimental = capabilities.experimental as Record<string, unknown> | undefined;
    this.server = experimental?.[EXPERIMENTAL_KEY] as ServerCapabilities | undefined;
  }

  getState(): { kind: 'static' } {
    return { kind: 'static' };
  }

  clear(): void {
    this.server = undefined;
  }
}

/** Restarts a crashed server a few times, then gives up with a message saying how to retry. */
class LimitedRestarts implements ErrorHandler {
  constructor(
    private readonly limiter: RestartLimiter,
    private readonly output: vscode.OutputChannel,
  ) {}

  error(): ErrorHandlerResult {
    // Writes to a crashed server fail until its close is seen. Shutting down after a few of them (the
    // library's default) stops the client first, and a stopping client never asks closed() to restart.
    return { action: ErrorAction.Continue, handled: true };
  }

  closed(): CloseHandlerResult {
    if (this.limiter.allow()) {
      this.output.appendLine('context-sidecar exited unexpectedly; restarting it.');
      return { action: CloseAction.Restart, handled: true };
    }
    return {
      action: CloseAction.DoNotRestart,
      message:
        `context-sidecar exited ${this.limiter.limit + 1} times within a few minutes and will not be ` +
        'restarted. See the "Context Sidecar" output, then run "Context Sidecar: Restart Server".',
    };
  }
}

export interface SidecarClientEvents {
  onUsage(usage: Usage): void;
  onDidCompact(params: DidCompactParams): void;
  onRunning(): void;
}

/** One LanguageClient at a time; `restart` builds a new one so a changed command takes effect. */
export class SidecarClient implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private readonly capabilities = new SidecarCapabilities();
  private readonly limiter = new RestartLimiter();
  private stateListener: vscode.Disposable | undefined;

  constructor(
    private readonly output: vscode.OutputChannel,
    private readonly events: SidecarClientEvents,
  ) {}

  get requests(): SidecarRequests | undefined {
    return this.client?.isRunning() ? new SidecarRequests(this.client) : undefined;
  }

  get serverCapabilities(): ServerCapabilities | undefined {
    // State.Running fires before the client initializes its features: read the result itself until then.
    const experimental = this.client?.initializeResult?.capabilities.experimental as Record<string, unknown> | undefined;
    return this.capabilities.server ?? (experimental?.[EXPERIMENTAL_KEY] as ServerCapabilities | undefined);
  }

  async start(): Promise<void> {
    const launch = currentServerLaunch();
    const client = this.create(launch);
    this.client = client;
    this.limiter.reset();
    try {
      await client.start();
    } catch (error) {
      const detail = error instanceof Error ? error.message : String(error);
      void vscode.window.showErrorMessage(
        `Context Sidecar could not start "${launch.command}": ${detail}. ` +
          'Install context-sidecar or set "contextSidecar.serverCommand".',
      );
    }
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** Sends the current protocol settings; the server pushes fresh usage in return. */
  async sendSettings(): Promise<void> {
    if (this.client?.isRunning()) {
      await this.client.sendNotification('workspace/didChangeConfiguration', {
        settings: { [SETTINGS_SECTION]: currentProtocolSettings() },
      });
    }
  }

  /** `shutdown` then `exit`, as LSP wants; the client kills the process if it does not go. */
  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.stateListener?.dispose();
    this.stateListener = undefined;
    if (client?.needsStop()) {
      try {
        await client.stop(5000);
      } catch (error) {
        this.output.appendLine(`Stopping context-sidecar failed: ${String(error)}`);
      }
    }
  }

  dispose(): void {
    void this.stop();
  }

  private create(launch: ServerLaunch): LanguageClient {
    const serverOptions: ServerOptions = {
      command: launch.command,
      args: launch.args,
      transport: TransportKind.stdio,
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: [],
      outputChannel: this.output,
      initializationOptions: () => currentProtocolSettings(),
      errorHandler: new LimitedRestarts(this.limiter, this.output),
      middleware: {
        workspace: {
          // Answer the server's pull with protocol settings only: it reports unknown keys.
          configuration: (params) =>
            params.items.map((item) => (item.section === SETTINGS_SECTION ? currentProtocolSettings() : null)),
        },
      },
    };
    const client = new LanguageClient(CLIENT_ID, CLIENT_NAME, serverOptions, clientOptions);
    client.registerFeature(this.capabilities);
    client.onNotification(Methods.CONTEXT_DID_CHANGE_USAGE, (usage: Usage) => this.events.onUsage(usage));
    client.onNotification(Methods.CONTEXT_DID_COMPACT, (params: DidCompactParams) => this.events.onDidCompact(params));
    this.stateListener?.dispose();
    this.stateListener = client.onDidChangeState((change) => {
      if (change.newState === State.Running) {
        this.events.onRunning();
      }
    });
    return client;
  }
}
