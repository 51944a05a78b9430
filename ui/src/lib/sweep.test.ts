import { describe, expect, it } from 'vitest';
import { axisPosition, bestSoFar, parallelAxes } from './sweep';
import type { Trial } from './types';

function trial(index: number, value: number | 'NaN' | undefined, config: Trial['config'] = {}): Trial {
  return { index, jobId: `j${index}`, state: 'succeeded', config, value, resource: 0, reason: '', preemptions: 0 };
}

describe('bestSoFar', () => {
  it('tracks the running minimum in index order, skipping missing values', () => {
    const out = bestSoFar([trial(2, 0.5), trial(0, 0.9), trial(1, undefined), trial(3, 'NaN'), trial(4, 0.7)], 'minimize');
    expect(out.index).toEqual([0, 1, 2, 3, 4]);
    expect(out.best).toEqual([0.9, 0.9, 0.5, 0.5, 0.5]);
  });
  it('tracks the maximum when maximizing', () => {
    expect(bestSoFar([trial(0, 0.1), trial(1, 0.3), trial(2, 0.2)], 'maximize').best).toEqual([0.1, 0.3, 0.3]);
  });
});

describe('parallel coordinates', () => {
  const trials = [
    trial(0, 1, { lr: { floatValue: 0.1 }, opt: { stringValue: 'sgd' } }),
    trial(1, 3, { lr: { floatValue: 0.3 }, opt: { stringValue: 'adam' } }),
  ];
  it('makes numeric, categorical and objective axes', () => {
    const axes = parallelAxes(trials, 'loss');
    expect(axes.map((a) => [a.key, a.kind, a.min, a.max, a.categories])).toEqual([
      ['lr', 'config', 0.1, 0.3, undefined],
      ['opt', 'config', 0, 1, ['adam', 'sgd']],
      ['loss', 'objective', 1, 3, undefined],
    ]);
  });
  it('places trials between 0 and 1', () => {
    const [lr, opt, loss] = parallelAxes(trials, 'loss');
    expect(axisPosition(lr, trials[1])).toBeCloseTo(1, 10);
    expect(axisPosition(opt, trials[0])).toBe(1);
    expect(axisPosition(loss, trials[0])).toBe(0);
    expect(axisPosition(lr, trial(2, undefined))).toBeUndefined();
  });
  it('reads a knob spanning orders of magnitude on a log scale', () => {
    const spread = [1e-4, 1e-3, 1e-2].map((lr, i) => trial(i, 1, { lr: { floatValue: lr } }));
    const [lr] = parallelAxes(spread, 'loss');
    expect(lr.log).toBe(true);
    expect(axisPosition(lr, spread[1])).toBeCloseTo(0.5, 10);
    expect(parallelAxes(trials, 'loss')[0].log).toBe(false);
  });
});
