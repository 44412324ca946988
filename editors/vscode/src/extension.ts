/** Activation only: the rest lives in controller, client, commands and the pure modules. */
import * as vscode from 'vscode';
import { ContextSidecarApi, createApi } from './api';
import { registerCommands } from './commands';
import { SidecarController } from './controller';
import { SETTINGS_SECTION } from './protocol';
import { ReadonlyDocuments } from './readonlyDocuments';
import { RESTART_SETTING_SECTIONS } from './settings';

let controller: SidecarController | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<ContextSidecarApi> {
  const output = vscode.window.createOutputChannel('Context Sidecar');
  const sidecar = new SidecarController(output);
  const documents = new ReadonlyDocuments();
  controller = sidecar;
  context.subscriptions.push(output, documents, ...registerCommands(sidecar, documents));
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (RESTART_SETTING_SECTIONS.some((section) => event.affectsConfiguration(`${SETTINGS_SECTION}.${section}`))) {
        sidecar.client.restart().catch((error) => output.appendLine(`Restarting failed: ${String(error)}`));
      } else if (event.affectsConfiguration(`${SETTINGS_SECTION}.followWorkspace`)) {
        void sidecar.follow().then(() => sidecar.refresh());
      } else if (event.affectsConfiguration(`${SETTINGS_SECTION}.watchAgents`)) {
        void sidecar.watchAgents().then(() => sidecar.refresh());
      } else if (event.affectsConfiguration(SETTINGS_SECTION)) {
        sidecar.client
          .sendSettings()
          // The server pushes new usage only for sessions it has touched since it started: read the shown one's.
          .then(() => sidecar.refresh())
          .catch((error) => output.appendLine(`Sending settings failed: ${String(error)}`));
      }
    }),
  );
  await sidecar.client.start();
  return createApi(sidecar);
}

export async function deactivate(): Promise<void> {
  const sidecar = controller;
  controller = undefined;
  if (sidecar) {
    await sidecar.client.stop();
    sidecar.dispose();
  }
}
