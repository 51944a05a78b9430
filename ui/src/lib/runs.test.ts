import { describe, expect, it } from 'vitest';
import { parseFilter } from './filter';
import {
  bestOf, configColumns, filterJobs, keysForAllRuns, metricColumns, metricGoal, sortJobs, storeLatest, storeSummaries,
  type Latest, type RunMetrics,
} from './runs';
import type { Job, JsonDouble } from './types';

function job(id: string, config: Record<string, number>, extra: Partial<Job> = {}): Job {
  return {
    id, state: 'JOB_STATE_RUNNING', version: 1, reason: '', owner: 'u1', pool: '', runnerId: '', instanceId: '',
    attempt: 1, stopRequested: false, createdAtMs: 0, startedAtMs: 0, finishedAtMs: 0, preemptions: 0, market: '',
    cost: 0, onDemandCost: 0, summary: {}, sweepId: '',
    config: Object.fromEntries(Object.entries(config).map(([k, v]) => [k, { floatValue: v }])),
    spec: { name: `run-${id}`, project: 'default' } as Job['spec'],
    ...extra,
  };
}

const latest: Latest = new Map([
  ['a', new Map([['loss', 0.2], ['sys/cpu', 50]])],
  ['b', new Map([['loss', 0.9]])],
]);
const best: Latest = new Map([
  ['a', new Map([['loss', 0.15]])],
  ['b', new Map([['loss', 0.1]])],
]);
const metrics: RunMetrics = { latest, best };

describe('runs table model', () => {
  it('lists config keys most common first and metric keys without sys/', () => {
    expect(configColumns([job('a', { lr: 1, wd: 2 }), job('b', { lr: 1 })])).toEqual(['lr', 'wd']);
    expect(metricColumns(latest)).toEqual(['loss']);
  });

  it('filters on config and latest metrics together', () => {
    const jobs = [job('a', { lr: 0.1 }), job('b', { lr: 0.1 }), job('c', { lr: 0.001 })];
    expect(filterJobs(jobs, parseFilter('lr>0.01 loss<0.5').terms, metrics).map((j) => j.id)).toEqual(['a']);
  });

  it('filters on an owner by name when the name is known', () => {
    const jobs = [job('a', {}), job('b', {}, { owner: 'u2' })];
    expect(filterJobs(jobs, parseFilter('user:ada').terms, metrics, new Map([['u1', 'ada']])).map((j) => j.id)).toEqual(['a']);
  });

  it('sorts by a metric with missing values last in both directions', () => {
    const jobs = [job('c', {}), job('b', {}), job('a', {})];
    const up = sortJobs(jobs, { key: { kind: 'metric', key: 'loss' }, descending: false }, metrics, 0);
    const down = sortJobs(jobs, { key: { kind: 'metric', key: 'loss' }, descending: true }, metrics, 0);
    expect(up.map((j) => j.id)).toEqual(['a', 'b', 'c']);
    expect(down.map((j) => j.id)).toEqual(['b', 'a', 'c']);
  });

  it('reads best(key) in a filter and sorts by best values', () => {
    const jobs = [job('a', {}), job('b', {}), job('c', {})];
    expect(filterJobs(jobs, parseFilter('best(loss)<0.12').terms, metrics).map((j) => j.id)).toEqual(['b']);
    // The latest loss of b is the worst, its best the best.
    expect(filterJobs(jobs, parseFilter('loss>0.5 best(loss)<=0.1').terms, metrics).map((j) => j.id)).toEqual(['b']);
    const up = sortJobs(jobs, { key: { kind: 'best', key: 'loss' }, descending: false }, metrics, 0);
    expect(up.map((j) => j.id)).toEqual(['b', 'a', 'c']);
  });

  it('tells lower-is-better metrics from higher-is-better ones', () => {
    for (const key of ['loss', 'val/loss', 'train_error', 'rmse', 'Perplexity', 'p99_latency_ms', 'wer']) expect(metricGoal(key)).toBe('min');
    for (const key of ['accuracy', 'val/acc', 'f1', 'reward', 'auc', 'tokens_per_second']) expect(metricGoal(key)).toBe('max');
    expect(bestOf('best(val/loss)')).toBe('val/loss');
    expect(bestOf('loss')).toBeUndefined();
  });

  it('lists the keys every run needs for a filter and a sort, config keys left out', () => {
    const terms = parseFilter('lr>0.1 loss<1 best(acc)>0.9 state:running').terms;
    expect(keysForAllRuns(terms, { kind: 'best', key: 'loss' }, ['lr'])).toEqual({ latest: ['loss'], best: ['acc', 'loss'] });
    expect(keysForAllRuns([], { kind: 'field', field: 'created' }, [])).toEqual({ latest: [], best: [] });
  });

  it('stores one whole-series band as the latest and the best value, by the key\'s goal', () => {
    const into: RunMetrics = { latest: new Map(), best: new Map() };
    const band = (mins: JsonDouble[], maxs: JsonDouble[], lasts: JsonDouble[]) => ({ steps: [9], timestampsMs: [0], mins, maxs, lasts });
    storeSummaries(into, [
      { jobId: 'a', key: 'loss', points: [], totalPoints: 10, bands: band([0.1], [2], [0.3]) },
      { jobId: 'a', key: 'acc', points: [], totalPoints: 10, bands: band([0.2], [0.95], ['NaN']) },
      { jobId: 'b', key: 'loss', points: [], totalPoints: 0, bands: { steps: [], timestampsMs: [], mins: [], maxs: [], lasts: [] } },
    ]);
    expect(into.latest.get('a')?.get('loss')).toBe(0.3);
    expect(into.best.get('a')?.get('loss')).toBe(0.1);
    expect(into.best.get('a')?.get('acc')).toBe(0.95);
    expect(Number.isNaN(into.latest.get('a')?.get('acc'))).toBe(true);
    expect(into.latest.has('b')).toBe(false);
    storeLatest(into, [{ jobId: 'a', key: 'loss', points: [{ key: 'loss', step: 10, value: 0.25, timestampMs: 1 }], totalPoints: 1 }]);
    expect(into.latest.get('a')?.get('loss')).toBe(0.25);
    expect(into.best.get('a')?.get('loss')).toBe(0.1);
  });
});
