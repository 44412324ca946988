/** The status bar item: percent, state and hint of the selected session. */
import * as vscode from 'vscode';
import { Usage } from './protocol';
import { formatStatus, StatusLook } from './status';

const BACKGROUNDS: Record<StatusLook, string | undefined> = {
  normal: undefined,
  warning: 'statusBarItem.warningBackground',
  error: 'statusBarItem.errorBackground',
};

export class UsageStatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('contextSidecar.usage', vscode.StatusBarAlignment.Right, 100);

  constructor() {
    this.item.name = 'Context Sidecar usage';
    this.item.command = 'contextSidecar.showUsage';
    this.show(undefined, undefined);
    this.item.show();
  }

  show(usage: Usage | undefined, sessionId: string | undefined): void {
    const view = formatStatus(usage, sessionId);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    const background = BACKGROUNDS[view.look];
    this.item.backgroundColor = background ? new vscode.ThemeColor(background) : undefined;
    this.item.command = usage && usage.state !== 'ok' && usage.state !== 'compacting'
      ? 'contextSidecar.compact'
      : 'contextSidecar.showUsage';
  }

  dispose(): void {
    this.item.dispose();
  }
}
