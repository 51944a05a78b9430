import { describe, expect, it } from 'vitest';
import { parseFilter } from './filter';
import { configColumns, filterJobs, metricColumns, sortJobs, type Latest } from './runs';
import type { Job } from './types';

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

describe('runs table model', () => {
  it('lists config keys most common first and metric keys without sys/', () => {
    expect(configColumns([job('a', { lr: 1, wd: 2 }), job('b', { lr: 1 })])).toEqual(['lr', 'wd']);
    expect(metricColumns(latest)).toEqual(['loss']);
  });

  it('filters on config and latest metrics together', () => {
    const jobs = [job('a', { lr: 0.1 }), job('b', { lr: 0.1 }), job('c', { lr: 0.001 })];
    expect(filterJobs(jobs, parseFilter('lr>0.01 loss<0.5').terms, latest).map((j) => j.id)).toEqual(['a']);
  });

  it('filters on an owner by name when the name is known', () => {
    const jobs = [job('a', {}), job('b', {}, { owner: 'u2' })];
    expect(filterJobs(jobs, parseFilter('user:ada').terms, latest, new Map([['u1', 'ada']])).map((j) => j.id)).toEqual(['a']);
  });

  it('sorts by a metric with missing values last in both directions', () => {
    const jobs = [job('c', {}), job('b', {}), job('a', {})];
    const up = sortJobs(jobs, { key: { kind: 'metric', key: 'loss' }, descending: false }, latest, 0);
    const down = sortJobs(jobs, { key: { kind: 'metric', key: 'loss' }, descending: true }, latest, 0);
    expect(up.map((j) => j.id)).toEqual(['a', 'b', 'c']);
    expect(down.map((j) => j.id)).toEqual(['b', 'a', 'c']);
  });
});
