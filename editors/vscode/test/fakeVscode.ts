/**
 * Just enough of the `vscode` module to run the bundled extension, with the real
 * vscode-languageclient and the real server, under Node. What the extension itself uses is
 * implemented and recorded; everything else vscode-languageclient touches is an inert stub.
 */
import { CancellationTokenSource, Emitter } from 'vscode-jsonrpc';

/** A function, class and namespace at once: calls and `new` give more stubs, `dispose` is a no-op. */
function stub(): any {
  const target = function () {} as any;
  return new Proxy(target, {
    get(_, prop) {
      if (prop === 'then' || typeof prop === 'symbol') {
        return undefined;
      }
      if (prop === 'dispose') {
        return () => {};
      }
      if (prop === 'prototype') {
        return target.prototype;
      }
      return stub();
    },
    apply: () => stub(),
    construct: () => stub(),
  });
}

function withStubs<T extends object>(real: T): T {
  return new Proxy(real, {
    get(target: any, prop) {
      return prop in target ? target[prop] : stub();
    },
  });
}

class Disposable {
  static from(...items: Array<{ dispose(): unknown }>): Disposable {
    return new Disposable(() => items.forEach((i) => i.dispose()));
  }
  constructor(private readonly onDispose: () => unknown = () => {}) {}
  dispose(): void {
    this.onDispose();
  }
}

class Uri {
  private constructor(
    readonly scheme: string,
    readonly path: string,
    readonly query = '',
  ) {}
  static from(parts: { scheme: string; path?: string; query?: string }): Uri {
    return new Uri(parts.scheme, parts.path ?? '', parts.query ?? '');
  }
  static file(path: string): Uri {
    return new Uri('file', path);
  }
  static parse(value: string): Uri {
    const colon = value.indexOf(':');
    return new Uri(value.slice(0, colon), value.slice(colon + 1).replace(/^\/\//, ''));
  }
  get fsPath(): string {
    return this.path;
  }
  toString(): string {
    return `${this.scheme}:${this.path}${this.query ? `?${this.query}` : ''}`;
  }
}

class ThemeColor {
  constructor(readonly id: string) {}
}

export interface StatusItem {
  text: string;
  tooltip?: string;
  command?: string;
  backgroundColor?: ThemeColor;
  name?: string;
  visible: boolean;
}

export interface FakeVscode {
  module: any;
  settings: Record<string, unknown>;
  statusItems: StatusItem[];
  messages: Array<{ level: string; text: string }>;
  output: string[];
  commands: Map<string, (...args: any[]) => any>;
  documents: Map<string, string>;
  /** Answers for showInputBox, in order; undefined is Escape. */
  inputs: Array<string | undefined>;
  /** Every withProgress call: its reports, and a source that cancels it. */
  progress: Array<{ title?: string; reports: Array<{ message?: string }>; cancel: CancellationTokenSource }>;
  fireConfigurationChange(section: string): void;
}

export function createFakeVscode(settings: Record<string, unknown>): FakeVscode {
  const statusItems: StatusItem[] = [];
  const messages: Array<{ level: string; text: string }> = [];
  const output: string[] = [];
  const commands = new Map<string, (...args: any[]) => any>();
  const providers = new Map<string, { provideTextDocumentContent(uri: Uri): Promise<string> | string }>();
  const documents = new Map<string, string>();
  const inputs: Array<string | undefined> = [];
  const progress: FakeVscode['progress'] = [];
  const configurationChanged = new Emitter<{ affectsConfiguration(section: string): boolean }>();

  const configuration = (section?: string) => {
    const full = (key: string) => (section ? `${section}.${key}` : key);
    return withStubs({
      get: (key: string, fallback?: unknown) => settings[full(key)] ?? fallback,
      has: (key: string) => full(key) in settings,
      inspect: (key: string) => ({ key: full(key), globalValue: settings[full(key)] }),
      update: async () => {},
    });
  };

  const message = (level: string) => async (text: string) => {
    messages.push({ level, text });
    return undefined;
  };

  const window = withStubs({
    createOutputChannel: (name: string) =>
      withStubs({
        name,
        append: (text: string) => output.push(text),
        appendLine: (text: string) => output.push(text),
        show: () => {},
        dispose: () => {},
      }),
    createStatusBarItem: () => {
      const item: StatusItem = { text: '', visible: false };
      statusItems.push(item);
      return Object.assign(item, {
        show: () => (item.visible = true),
        hide: () => (item.visible = false),
        dispose: () => (item.visible = false),
      });
    },
    showInformationMessage: message('info'),
    showWarningMessage: message('warning'),
    showErrorMessage: message('error'),
    setStatusBarMessage: (text: string) => {
      messages.push({ level: 'status', text });
      return new Disposable();
    },
    showInputBox: async () => inputs.shift(),
    showQuickPick: async () => undefined,
    showTextDocument: async (document: unknown) => document,
    withProgress: async (options: { title?: string }, task: (p: unknown, token: unknown) => Promise<unknown>) => {
      const entry = { title: options.title, reports: [] as Array<{ message?: string }>, cancel: new CancellationTokenSource() };
      progress.push(entry);
      return task({ report: (value: { message?: string }) => entry.reports.push(value) }, entry.cancel.token);
    },
  });

  const workspace = withStubs({
    workspaceFolders: undefined,
    getConfiguration: configuration,
    onDidChangeConfiguration: configurationChanged.event,
    registerTextDocumentContentProvider: (scheme: string, provider: any) => {
      providers.set(scheme, provider);
      return new Disposable(() => providers.delete(scheme));
    },
    openTextDocument: async (uri: Uri) => {
      const text = await providers.get(uri.scheme)!.provideTextDocumentContent(uri);
      documents.set(uri.toString(), text);
      return { uri, getText: () => text };
    },
  });

  const module = withStubs({
    version: '1.90.0',
    env: withStubs({ appName: 'Visual Studio Code', language: 'en', uiKind: 1 }),
    Disposable,
    Uri,
    ThemeColor,
    EventEmitter: Emitter,
    CancellationTokenSource,
    StatusBarAlignment: { Left: 1, Right: 2 },
    ProgressLocation: { SourceControl: 1, Window: 10, Notification: 15 },
    window,
    workspace,
    commands: withStubs({
      registerCommand: (id: string, run: (...args: any[]) => any) => {
        commands.set(id, run);
        return new Disposable(() => commands.delete(id));
      },
      executeCommand: async (id: string, ...args: any[]) => commands.get(id)?.(...args),
    }),
    languages: withStubs({ setTextDocumentLanguage: async (document: unknown) => document }),
  });

  return {
    module,
    settings,
    statusItems,
    messages,
    output,
    commands,
    documents,
    inputs,
    progress,
    fireConfigurationChange: (section: string) =>
      configurationChanged.fire({ affectsConfiguration: (s: string) => s === section || section.startsWith(`${s}.`) }),
  };
}
