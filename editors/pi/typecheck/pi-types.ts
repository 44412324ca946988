/**
 * Compiled only against pi's own declarations (scripts/check-pi-types.mjs, when the pinned pi is
 * installed): what pi hands this extension has the shapes src/pi.ts declares, and what the extension
 * gives pi back is what pi takes.
 */
import type { AgentMessage as PiMessage } from '@mariozechner/pi-agent-core';
import type {
  ContextEvent as PiContextEvent,
  CompactionResult,
  ExtensionAPI,
  ExtensionContext,
  ExtensionEvent,
  SessionBeforeCompactEvent,
  SessionEntry as PiEntry,
  ToolDefinition as PiToolDefinition,
  ToolInfo as PiToolInfo,
} from '@mariozechner/pi-coding-agent';
import type {
  AgentMessage,
  BeforeCompactEvent,
  BeforeCompactResult,
  ContextEvent,
  ContextView,
  ExtensionApi,
  MessageEndEvent,
  SessionEntry,
  ToolDefinition,
  ToolInfo,
} from '../src/pi';

type PiMessageEndEvent = Extract<ExtensionEvent, { type: 'message_end' }>;
/** pi's SessionBeforeCompactResult (not exported by its index). */
interface Compaction {
  cancel?: boolean;
  compaction?: CompactionResult;
}

// What pi hands over.
export const context = (c: ExtensionContext): ContextView => c;
export const contextEvent = (e: PiContextEvent): ContextEvent => e;
export const messageEnd = (e: PiMessageEndEvent): MessageEndEvent => e;
export const compactEvent = (e: SessionBeforeCompactEvent): BeforeCompactEvent => e;
export const entry = (e: PiEntry): SessionEntry => e;
export const message = (m: PiMessage): AgentMessage => m;
export const toolInfo = (t: PiToolInfo): ToolInfo => t;

// What the extension gives back.
export const compactResult = (r: BeforeCompactResult): Compaction => r;
export const tool = (t: ToolDefinition): PiToolDefinition => t;

// The methods of pi it calls.
export function calls(pi: ExtensionAPI, ours: ExtensionApi, definition: ToolDefinition): void {
  pi.registerTool(definition);
  const active: string[] = pi.getActiveTools();
  pi.setActiveTools(active);
  const all: ToolInfo[] = pi.getAllTools();
  const name: string | undefined = pi.getSessionName();
  void [ours, all, name];
}
