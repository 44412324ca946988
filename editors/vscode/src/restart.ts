/** How often a crashed server is restarted: at most `limit` times within `windowMs`. */
export class RestartLimiter {
  private readonly restarts: number[] = [];

  constructor(
    readonly limit = 4,
    readonly windowMs = 3 * 60 * 1000,
  ) {}

  /** Records a crash at `now`; true when another restart is still allowed. */
  allow(now: number = Date.now()): boolean {
    while (this.restarts.length > 0 && now - this.restarts[0] > this.windowMs) {
      this.restarts.shift();
    }
    if (this.restarts.length >= this.limit) {
      return false;
    }
    this.restarts.push(now);
    return true;
  }

  reset(): void {
    this.restarts.length = 0;
  }
}
