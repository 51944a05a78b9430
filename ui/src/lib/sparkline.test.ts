import { describe, expect, it } from 'vitest';
import { keepRecent, stepPath } from './sparkline';

describe('sparkline', () => {
  it('draws steps from 0 at the bottom to the highest value at the top', () => {
    const points = [{ atMs: 0, value: 0 }, { atMs: 1000, value: 2 }, { atMs: 2000, value: 1 }, { atMs: 4000, value: 1 }];
    expect(stepPath(points, 100, 20)).toBe('M0,20 H25 V0 H50 V10 H100 V10');
  });

  it('draws nothing without two samples, and a flat zero line on a scale of one', () => {
    expect(stepPath([{ atMs: 5, value: 3 }], 100, 20)).toBe('');
    expect(stepPath([{ atMs: 0, value: 0 }, { atMs: 10, value: 0 }], 100, 20)).toBe('M0,20 H100 V20');
  });

  it('keeps only the window before the newest sample', () => {
    const kept = keepRecent([{ atMs: 0, value: 1 }, { atMs: 500, value: 2 }], { atMs: 1200, value: 3 }, 1000);
    expect(kept.map((p) => p.value)).toEqual([2, 3]);
  });
});
