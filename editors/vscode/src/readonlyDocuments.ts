/** Read-only virtual documents (`context-sidecar:` URIs) for expansions and the session list. */
import * as vscode from 'vscode';

export const SCHEME = 'context-sidecar';

type Render = () => Promise<string>;

export class ReadonlyDocuments implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly renderers = new Map<string, Render>();
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;
  private readonly registration = vscode.workspace.registerTextDocumentContentProvider(SCHEME, this);

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const render = this.renderers.get(uri.toString());
    if (!render) {
      return 'This document is gone: run the command again.';
    }
    try {
      return await render();
    } catch (error) {
      return `Could not load: ${error instanceof Error ? error.message : String(error)}`;
    }
  }

  /** Opens (or refreshes) the document at `path` (ending in `.md`), whose text `render` produces. */
  async open(path: string, render: Render): Promise<void> {
    const uri = vscode.Uri.from({ scheme: SCHEME, path });
    this.renderers.set(uri.toString(), render);
    this.changed.fire(uri);
    // Paths end in `.md`, so VS Code shows them as Markdown.
    const document = await vscode.workspace.openTextDocument(uri);
    await vscode.window.showTextDocument(document, { preview: true });
  }

  dispose(): void {
    this.registration.dispose();
    this.changed.dispose();
  }
}
