import { describe, expect, it } from 'vitest';
import { debiasedEma } from './ema';

describe('debiasedEma', () => {
  it('is the identity at weight 0', () => {
    expect(debiasedEma([1, 5, 2], 0)).toEqual([1, 5, 2]);
  });

  it('starts at the first value instead of near zero (de-biased)', () => {
    const out = debiasedEma([10, 20], 0.5);
    // raw EMA: 5, then 12.5; de-biased by 1-0.5 and 1-0.25
    expect(out[0]).toBeCloseTo(10, 10);
    expect(out[1]).toBeCloseTo(12.5 / 0.75, 10);
  });

  it('matches a hand computation at weight 0.9', () => {
    const out = debiasedEma([1, 2, 3], 0.9);
    const raw = [0.1, 0.1 * 0.9 + 0.2, (0.1 * 0.9 + 0.2) * 0.9 + 0.3];
    expect(out[2]).toBeCloseTo(raw[2] / (1 - 0.9 ** 3), 10);
  });

  it('passes non-finite values and gaps through without breaking the average', () => {
    const out = debiasedEma([2, NaN, null, 4], 0.5);
    expect(Number.isNaN(out[1])).toBe(true);
    expect(out[2]).toBeNull();
    // 4 is the second finite point: (0.5*1 + 0.5*4) / (1-0.25)
    expect(out[3]).toBeCloseTo((0.5 * 1 + 2) / 0.75, 10);
  });

  it('keeps a constant series exact', () => {
    expect(debiasedEma([0.3, 0.3, 0.3], 0.99)).toEqual([0.3, 0.3, 0.3]);
  });
});
