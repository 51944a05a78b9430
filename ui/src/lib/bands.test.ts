import { describe, expect, it } from 'vitest';
import { alignSeries, bandsToColumns, bandsToData } from './bands';

describe('bandsToData', () => {
  it('turns columns into uPlot data, with NaN strings and infinities as gaps', () => {
    const data = bandsToData({
      steps: [9, 19, 29],
      timestampsMs: [0, 0, 0],
      mins: [0.5, 'NaN', -1],
      maxs: [1.5, 'Infinity', 2],
      lasts: [1, 'NaN', '-Infinity'],
    });
    expect(data).toEqual([[9, 19, 29], [1, null, null], [0.5, null, -1], [1.5, null, 2]]);
  });

  it('gives empty data for absent bands', () => {
    expect(bandsToData(undefined)).toEqual([[], [], [], []]);
  });

  it('cuts to the shortest of steps and lasts', () => {
    expect(bandsToData({ steps: [1, 2], timestampsMs: [0, 0], mins: [0], maxs: [0], lasts: [5] })[0]).toEqual([1]);
  });
});

describe('bandsToColumns', () => {
  const bands = {
    steps: [1, 2, 3],
    timestampsMs: [1000, 2500, 2500],
    mins: [0, 0, 0],
    maxs: [9, 9, 9],
    lasts: ['NaN' as const, 4, 5],
  };
  it('gives steps and lasts on a step axis', () => {
    expect(bandsToColumns(bands, 'step')).toEqual([[1, 2, 3], [null, 4, 5]]);
  });
  it('gives seconds on a time axis, keeping the later of two buckets at one time', () => {
    expect(bandsToColumns(bands, 'time')).toEqual([[1, 2.5], [null, 5]]);
  });
});

describe('alignSeries', () => {
  it('joins x values and fills gaps with null', () => {
    expect(alignSeries([[[1, 3], [10, 30]], [[2, 3], [20, 31]]])).toEqual([
      [1, 2, 3],
      [10, null, 30],
      [null, 20, 31],
    ]);
  });
});
