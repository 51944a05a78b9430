import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { StreamHandlers } from './api';
import { BATCH_FEED, type FeedMessage } from './feed';
import type { Batch } from './types';
import { watchList } from './watch';

// The api as the watch sees it: each stream opened (its request and handlers), and ListBatches.
const streams: { request: object; handlers: StreamHandlers<FeedMessage>; closed: boolean }[] = [];
const listed = vi.fn();
vi.mock('./api', () => ({
  stream: (_service: string, _method: string, request: object, handlers: StreamHandlers<FeedMessage>) => {
    const opened = { request, handlers, closed: false };
    streams.push(opened);
    return () => (opened.closed = true);
  },
  rpc: async (_service: string, method: string, request: object) => listed(method, request),
}));

const batch = (id: string) => ({ id }) as Batch;
const shown: string[][] = [];
function watch() {
  return watchList(BATCH_FEED, { all: true }, { onChange: (list) => shown.push(list.records.map((one) => one.id)), onError: () => {} });
}

beforeEach(() => {
  vi.useFakeTimers();
  vi.stubGlobal('document', { visibilityState: 'visible' });
  streams.length = 0;
  shown.length = 0;
  listed.mockReset();
  listed.mockResolvedValue({ batches: [batch('b'), batch('a')] });
});
afterEach(() => {
  vi.useRealTimers();
  vi.unstubAllGlobals();
});

describe('watchList', () => {
  it('follows the feed, and goes on after the last seq when a watch ends', async () => {
    const watched = watch();
    expect(streams[0].request).toEqual({ list: { all: true } });
    streams[0].handlers.onMessage({ batches: [batch('a')], seq: 7, reset: true }, '7');
    streams[0].handlers.onMessage({ batches: [batch('b')], seq: 8, reset: false }, '8');
    expect(shown).toEqual([['a'], ['b', 'a']]);
    await vi.advanceTimersByTimeAsync(300_000);
    streams[0].handlers.onEnd?.();
    expect(streams[1].request).toEqual({ list: { all: true }, afterSeq: 8 });
    expect([watched.polling, listed.mock.calls.length]).toEqual([false, 0]);
    watched.close();
    expect(streams[1].closed).toBe(true);
  });

  it('polls the list while the feed fails, and stops once it answers again', async () => {
    const watched = watch();
    streams[0].handlers.onError?.({} as never);
    expect(watched.polling).toBe(true);
    await vi.advanceTimersByTimeAsync(0);
    expect(listed.mock.calls).toEqual([['ListBatches', { all: true }]]);
    expect(shown).toEqual([['b', 'a']]);
    await vi.advanceTimersByTimeAsync(2_000);
    expect(listed).toHaveBeenCalledTimes(2);
    // The feed is tried again a minute later; a polled list has no seq, so it lists again.
    await vi.advanceTimersByTimeAsync(60_000);
    expect(streams[1].request).toEqual({ list: { all: true } });
    const polls = listed.mock.calls.length;
    streams[1].handlers.onMessage({ batches: [batch('c')], seq: 9, reset: true }, '9');
    expect(watched.polling).toBe(false);
    await vi.advanceTimersByTimeAsync(10_000);
    expect(listed).toHaveBeenCalledTimes(polls);
    expect(shown.at(-1)).toEqual(['c']);
    watched.close();
  });

  it('counts a watch that ends at once as a failure', async () => {
    const watched = watch();
    streams[0].handlers.onEnd?.();
    expect([watched.polling, streams.length]).toEqual([true, 1]);
    watched.close();
    await vi.advanceTimersByTimeAsync(120_000);
    expect(streams.length).toBe(1);
  });
});
