/** Activation only: the rest lives in controller, client, commands and the pure modules. */
import * as vscode from 'vscode';
import { ContextSidecarApi, createApi } from './api';
import { registerCommands } from './commands';
import { SidecarController } from './controller';
import { SETTINGS_SECTION } from './protocol';
import { ReadonlyDocuments } from './readonlyDocuments';

let controller: SidecarController | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<ContextSidecarApi> {
  const output = vscode.window.createOutputChannel('Context Sidecar');
  const sidecar = new SidecarController(output);
  const documents = new ReadonlyDocuments();
  controller = sidecar;
  context.subscriptions.push(output, documents, ...registerCommands(sidecar, documents));
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (
        event.affectsConfiguration(`${SETTINGS_SECTION}.serverCommand`) ||
        event.affectsConfiguration(`${SETTINGS_SECTION}.serverArgs`)
      ) {
        sidecar.client.restart().catch((error) => output.appendLine(`Restarting failed: ${String(error)}`));
      } else if (event.affectsConfiguration(`${SETTINGS_SECTION}.followWorkspace`)) {
        void sidecar.follow().then(() => sidecar.refresh());
      } else if (event.affectsConfiguration(SETTINGS_SECTION)) {
        sidecar.client.sendSettings().catch((error) => output.appendLine(`Sending settings failed: ${String(error)}`));
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
