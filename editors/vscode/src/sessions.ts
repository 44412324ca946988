/** Which session the editor shows: one an agent pinned, or else the most recently updated one. */
import { Emitter, Event } from 'vscode-jsonrpc';
import { SessionInfo, Usage } from './protocol';

/** The session with the newest `updatedAt`. */
export function mostRecentSession(sessions: readonly SessionInfo[]): SessionInfo | undefined {
  let best: SessionInfo | undefined;
  let bestTime = -Infinity;
  for (const session of sessions) {
    const time = Date.parse(session.updatedAt);
    const comparable = Number.isNaN(time) ? -Infinity : time;
    if (!best || comparable > bestTime) {
      best = session;
      bestTime = comparable;
    }
  }
  return best;
}

/**
 * Holds the selected session and the newest usage of every session seen. Unpinned, the
 * selection follows whichever session changed last, which is the most recently updated one.
 */
export class SessionSelection {
  private selected: string | undefined;
  private pinnedId = false;
  private readonly usages = new Map<string, Usage>();
  private readonly notifications = new Map<string, number>();
  private readonly changed = new Emitter<Usage | undefined>();

  /** Fires with the selected session's usage whenever it or the selection changes. */
  readonly onDidChange: Event<Usage | undefined> = this.changed.event;

  get sessionId(): string | undefined {
    return this.selected;
  }

  get pinned(): boolean {
    return this.pinnedId;
  }

  get usage(): Usage | undefined {
    return this.selected === undefined ? undefined : this.usages.get(this.selected);
  }

  /** Pin a session (an agent or the user chose it); `undefined` goes back to following the latest. */
  pin(sessionId: string | undefined): void {
    this.pinnedId = sessionId !== undefined;
    this.select(sessionId);
  }

  /** The default when nothing is pinned: the most recently updated stored session. */
  adoptDefault(sessions: readonly SessionInfo[]): void {
    if (this.pinnedId) {
      return;
    }
    const latest = mostRecentSession(sessions);
    if (latest) {
      this.select(latest.sessionId);
    }
  }

  /** Notifications received for a session so far; see `updateFromReply`. */
  version(sessionId: string): number {
    return this.notifications.get(sessionId) ?? 0;
  }

  /** Record a usage pushed with `context/didChangeUsage`. */
  notified(usage: Usage): void {
    this.notifications.set(usage.sessionId, this.version(usage.sessionId) + 1);
    this.update(usage);
  }

  /**
   * Record a usage from a `context/usage` reply, unless a notification came while the request
   * was on its way: the reply can describe an older state (e.g. `compacting` after the end).
   */
  updateFromReply(usage: Usage, versionAtRequest: number): void {
    if (this.version(usage.sessionId) === versionAtRequest) {
      this.update(usage);
    }
  }

  /** Record a usage. */
  update(usage: Usage): void {
    this.usages.set(usage.sessionId, usage);
    if (!this.pinnedId && usage.sessionId !== this.selected) {
      this.select(usage.sessionId);
      return;
    }
    if (usage.sessionId === this.selected) {
      this.changed.fire(usage);
    }
  }

  /** Forget a session's figures, e.g. after it was deleted. */
  forget(sessionId: string): void {
    this.usages.delete(sessionId);
    if (sessionId === this.selected) {
      this.selected = undefined;
      this.pinnedId = false;
      this.changed.fire(undefined);
    }
  }

  dispose(): void {
    this.changed.dispose();
  }

  private select(sessionId: string | undefined): void {
    const changed = sessionId !== this.selected;
    this.selected = sessionId;
    if (changed) {
      this.changed.fire(this.usage);
    }
  }
}
