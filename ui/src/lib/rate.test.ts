import { describe, expect, it } from 'vitest';
import { addSample, etaSeconds, rateOf } from './rate';

describe('rate and ETA', () => {
  it('measures the rate over the window', () => {
    let samples = addSample([], { atMs: 0, done: 0 }, 60_000);
    samples = addSample(samples, { atMs: 2_000, done: 10 }, 60_000);
    samples = addSample(samples, { atMs: 4_000, done: 30 }, 60_000);
    expect(rateOf(samples)).toBe(7.5);
  });

  it('forgets samples older than the window', () => {
    let samples = [{ atMs: 0, done: 0 }, { atMs: 50_000, done: 100 }];
    samples = addSample(samples, { atMs: 70_000, done: 140 }, 30_000);
    expect(samples.map((s) => s.atMs)).toEqual([50_000, 70_000]);
    expect(rateOf(samples)).toBe(2);
  });

  it('keeps the last two samples when the gap is wider than the window', () => {
    const samples = addSample([{ atMs: 0, done: 0 }], { atMs: 100_000, done: 50 }, 10_000);
    expect(rateOf(samples)).toBe(0.5);
  });

  it('has no rate from one sample or no elapsed time', () => {
    expect(rateOf([{ atMs: 5, done: 1 }])).toBeUndefined();
    expect(rateOf([{ atMs: 5, done: 1 }, { atMs: 5, done: 3 }])).toBeUndefined();
  });

  it('computes the ETA, rounding up', () => {
    expect(etaSeconds(100, 3)).toBe(34);
    expect(etaSeconds(0, undefined)).toBe(0);
    expect(etaSeconds(5, 0)).toBeUndefined();
  });
});
