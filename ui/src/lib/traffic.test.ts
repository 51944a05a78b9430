import { describe, expect, it } from 'vitest';
import { trafficCells } from './traffic';

describe('service traffic cells', () => {
  it('shows rate, latency percentiles and partial and failed shares', () => {
    const cells = trafficCells({
      windowSeconds: 300, requests: 6000, answered: 5700, partial: 240, invalid: 30, failed: 30,
      p50Ms: 4.25, p95Ms: 38.2, p99Ms: 1250,
    });
    expect(cells).toEqual({ rate: '20/s', latency: '4.3 ms / 38 ms / 1.25 s', partial: '4.0%', failed: '1.0%' });
  });

  it('keeps small rates and shares readable', () => {
    const cells = trafficCells({ windowSeconds: 300, requests: 3, answered: 3, partial: 0, invalid: 0, failed: 0, p50Ms: 2, p95Ms: 2, p99Ms: 2 });
    expect(cells.rate).toBe('0.010/s');
    expect(cells.partial).toBe('0%');
    expect(trafficCells({ windowSeconds: 10, requests: 5000, answered: 4999, partial: 1, invalid: 0, failed: 0, p50Ms: 1, p95Ms: 1, p99Ms: 1 }).partial).toBe('<0.1%');
  });

  it('has empty cells without requests', () => {
    expect(trafficCells(undefined).rate).toBe('—');
    expect(trafficCells({ windowSeconds: 300, requests: 0, answered: 0, partial: 0, invalid: 0, failed: 0, p50Ms: 0, p95Ms: 0, p99Ms: 0 }).latency).toBe('—');
  });
});
