import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { RestartLimiter } from '../src/restart';

describe('restart limiter', () => {
  it('allows `limit` restarts within the window, then refuses', () => {
    const limiter = new RestartLimiter(3, 1000);
    assert.deepEqual([0, 10, 20, 30].map((t) => limiter.allow(t)), [true, true, true, false]);
  });

  it('allows again once old crashes leave the window', () => {
    const limiter = new RestartLimiter(2, 1000);
    assert.ok(limiter.allow(0));
    assert.ok(limiter.allow(500));
    assert.ok(!limiter.allow(900));
    assert.ok(limiter.allow(1600));
  });
});
