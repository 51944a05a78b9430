import { describe, expect, it } from 'vitest';
import { alignSeries, bandsToData, pointsToColumns } from './bands';

describe('bandsToData', () => {
  it('turns columns into uPlot data, with NaN strings and infinities as gaps', () => {
    const data = bandsToData({
      steps: [9, 19, 29],
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
    expect(bandsToData({ steps: [1, 2], mins: [0], maxs: [0], lasts: [5] })[0]).toEqual([1]);
  });
});

describe('pointsToColumns', () => {
  const points = [
    { key: 'k', step: 2, value: 3, timestampMs: 2000 },
    { key: 'k', step: 1, value: 'NaN' as const, timestampMs: 1000 },
    { key: 'k', step: 2, value: 4, timestampMs: 2500 },
  ];
  it('sorts by step and keeps the later of two points at one step', () => {
    expect(pointsToColumns(points, 'step')).toEqual([[1, 2], [null, 4]]);
  });
  it('uses seconds on a time axis', () => {
    expect(pointsToColumns(points, 'time')).toEqual([[1, 2, 2.5], [null, 3, 4]]);
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
