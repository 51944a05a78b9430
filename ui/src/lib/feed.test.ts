import { describe, expect, it } from 'vitest';
import {
  applyChanges, BATCH_FEED, changesOf, emptyList, JOB_FEED, position, SERVICE_FEED, SWEEP_FEED,
  type Changes, type LiveList,
} from './feed';
import type { Batch, Job, JobStateName, Service, Sweep } from './types';

/** A job whose id sorts by `n` (as UUIDv7 ids sort by creation). */
function job(n: number, state: JobStateName = 'JOB_STATE_RUNNING', version = 1): Job {
  return { id: `0193-${String(n).padStart(4, '0')}`, state, version } as Job;
}
const ids = (list: LiveList<Job>) => list.records.map((one) => Number(one.id.slice(5)));
const states = (list: LiveList<Job>) => list.records.map((one) => one.state);
const page = <T>(records: T[], seq = 0, reset = false): Changes<T> => ({ records, seq, reset });
const options = { limit: 5 };

describe('applyChanges (jobs: newest first by id, by version)', () => {
  it('takes the first list in pages: shown from the first, complete with the last', () => {
    let list = applyChanges(emptyList<Job>(), page([job(9), job(8)], 0, true), JOB_FEED, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[9, 8], 0, false]);
    list = applyChanges(list, page([job(7), job(6)], 0), JOB_FEED, options);
    expect([ids(list), list.complete]).toEqual([[9, 8, 7, 6], false]);
    list = applyChanges(list, page([job(5)], 42), JOB_FEED, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[9, 8, 7, 6, 5], 42, true]);
  });

  it('replaces a changed job in its place and puts a new one where its id sorts', () => {
    const start = applyChanges(emptyList<Job>(), page([job(9), job(7), job(5)], 10, true), JOB_FEED, options);
    const list = applyChanges(start, page([job(7, 'JOB_STATE_SUCCEEDED', 2), job(10), job(6)], 11), JOB_FEED, options);
    expect(ids(list)).toEqual([10, 9, 7, 6, 5]);
    expect(list.records[2].state).toBe('JOB_STATE_SUCCEEDED');
    expect(list.seq).toBe(11);
    // The list given is not changed.
    expect(ids(start)).toEqual([9, 7, 5]);
    expect(start.records[1].state).toBe('JOB_STATE_RUNNING');
  });

  it('keeps the newest `limit` jobs: a new one pushes the oldest out, an older one is not taken', () => {
    let list = applyChanges(emptyList<Job>(), page([job(9), job(8), job(7), job(6), job(5)], 1, true), JOB_FEED, options);
    list = applyChanges(list, page([job(10)], 2), JOB_FEED, options);
    expect(ids(list)).toEqual([10, 9, 8, 7, 6]);
    list = applyChanges(list, page([job(3, 'JOB_STATE_FAILED', 2)], 3), JOB_FEED, options);
    expect(ids(list)).toEqual([10, 9, 8, 7, 6]);
  });

  it('drops everything on a reset, even after a complete list', () => {
    let list = applyChanges(emptyList<Job>(), page([job(9), job(8)], 5, true), JOB_FEED, options);
    list = applyChanges(list, page([job(4)], 0, true), JOB_FEED, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[4], 0, false]);
    list = applyChanges(list, page([job(3)], 80), JOB_FEED, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[4, 3], 80, true]);
    // A reset that is also the whole list (one page) is complete at once.
    list = applyChanges(list, page([job(2)], 90, true), JOB_FEED, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[2], 90, true]);
  });

  it('never goes back to an earlier version of a job', () => {
    let list = applyChanges(emptyList<Job>(), page([job(9, 'JOB_STATE_SUCCEEDED', 4)], 5, true), JOB_FEED, options);
    list = applyChanges(list, page([job(9, 'JOB_STATE_RUNNING', 3)]), JOB_FEED, options);
    expect(states(list)).toEqual(['JOB_STATE_SUCCEEDED']);
    // The same version again (a run's config read anew) replaces it.
    const again = { ...job(9, 'JOB_STATE_SUCCEEDED', 4), reason: 'again' };
    list = applyChanges(list, page([again]), JOB_FEED, options);
    expect(list.records[0].reason).toBe('again');
    // A message without a seq (such a read) keeps the list's.
    expect(list.seq).toBe(5);
  });

  it('drops the jobs a list does not keep (a list of live ones: the ended)', () => {
    const live = { limit: 5, keep: (one: Job) => one.state !== 'JOB_STATE_SUCCEEDED' };
    let list = applyChanges(emptyList<Job>(), page([job(9), job(8)], 5, true), JOB_FEED, live);
    list = applyChanges(list, page([job(8, 'JOB_STATE_SUCCEEDED', 2), job(10, 'JOB_STATE_SUCCEEDED', 2)], 6), JOB_FEED, live);
    expect(ids(list)).toEqual([9]);
  });

  it('keeps 10,000 jobs in order through a burst of changes', () => {
    const first = Array.from({ length: 10_000 }, (_, i) => job(2 * (10_000 - i)));
    const all = { limit: 10_000 };
    let list = applyChanges(emptyList<Job>(), page(first.slice(0, 500), 0, true), JOB_FEED, all);
    for (let at = 500; at < first.length; at += 500) list = applyChanges(list, page(first.slice(at, at + 500), at === 9_500 ? 1 : 0), JOB_FEED, all);
    expect(list.records.length).toBe(10_000);
    const changed = Array.from({ length: 300 }, (_, i) => job(2 * (i * 33 + 1) + (i % 2), 'JOB_STATE_FAILED', 2));
    list = applyChanges(list, page(changed, 2), JOB_FEED, all);
    expect(list.records.length).toBe(10_000);
    const sorted = list.records.every((one, i) => i === 0 || list.records[i - 1].id > one.id);
    expect(sorted).toBe(true);
    expect(new Set(list.records.map((one) => one.id)).size).toBe(10_000);
  });
});

describe('applyChanges (batches: newest first by id, the last received wins)', () => {
  const batch = (n: number, state: Batch['state'] = 'BATCH_STATE_OPEN', total = 0) =>
    ({ id: `0193-${String(n).padStart(4, '0')}`, state, counts: { total } }) as Batch;
  const shown = (list: LiveList<Batch>) => list.records.map((one) => `${one.id.slice(5)} ${one.state.slice(12)} ${one.counts?.total}`);

  it('replaces a batch whole, whatever came before, and puts a new one first', () => {
    let list = applyChanges(emptyList<Batch>(), page([batch(9, 'BATCH_STATE_DONE', 3), batch(5)], 7, true), BATCH_FEED);
    list = applyChanges(list, page([batch(5, 'BATCH_STATE_SEALED', 20), batch(12)], 8), BATCH_FEED);
    expect(shown(list)).toEqual(['0012 OPEN 0', '0009 DONE 3', '0005 SEALED 20']);
    // No version: a batch sent again as it was before is taken too (the feed is in order).
    list = applyChanges(list, page([batch(9, 'BATCH_STATE_OPEN', 3)], 9), BATCH_FEED);
    expect(shown(list)[1]).toBe('0009 OPEN 3');
    expect([list.seq, list.complete]).toEqual([9, true]);
  });

  it('holds every batch without a limit', () => {
    const many = Array.from({ length: 1_200 }, (_, i) => batch(1_200 - i));
    const list = applyChanges(emptyList<Batch>(), page(many, 1, true), BATCH_FEED);
    expect(list.records.length).toBe(1_200);
  });
});

describe('applyChanges (sweeps: newest first by creation time, then id)', () => {
  const sweep = (id: string, createdAtMs: number, state = 'running') => ({ id, createdAtMs, state }) as Sweep;
  const shown = (list: LiveList<Sweep>) => list.records.map((one) => `${one.id} ${one.state}`);

  it('sorts by creation time, an id deciding a tie, and replaces a sweep by id', () => {
    let list = applyChanges(emptyList<Sweep>(), page([sweep('b', 300), sweep('c', 200), sweep('a', 200)], 4, true), SWEEP_FEED);
    expect(shown(list)).toEqual(['b running', 'c running', 'a running']);
    list = applyChanges(list, page([sweep('a', 200, 'finished'), sweep('d', 400), sweep('e', 200)], 5), SWEEP_FEED);
    expect(shown(list)).toEqual(['d running', 'b running', 'e running', 'c running', 'a finished']);
  });
});

describe('applyChanges (services: by name then project, no id)', () => {
  const service = (name: string, project: string, state = 'RUNNING') => ({ name, project, state }) as Service;
  const shown = (list: LiveList<Service>) => list.records.map((one) => `${one.project}/${one.name} ${one.state}`);

  it('is keyed by project and name: one name in two projects is two services', () => {
    let list = applyChanges(emptyList<Service>(), page([service('greeter', 'default'), service('greeter', 'vision'), service('scale', 'default')], 2, true), SERVICE_FEED);
    list = applyChanges(list, page([service('greeter', 'vision', 'STOPPED'), service('echo', 'vision'), service('greeter', 'alpha')], 3), SERVICE_FEED);
    expect(shown(list)).toEqual([
      'vision/echo RUNNING', 'alpha/greeter RUNNING', 'default/greeter RUNNING', 'vision/greeter STOPPED', 'default/scale RUNNING',
    ]);
  });

  it('drops the services a list does not keep', () => {
    const running = { keep: (one: Service) => one.state === 'RUNNING' };
    let list = applyChanges(emptyList<Service>(), page([service('a', 'p'), service('b', 'p')], 2, true), SERVICE_FEED, running);
    list = applyChanges(list, page([service('a', 'p', 'STOPPED')], 3), SERVICE_FEED, running);
    expect(shown(list)).toEqual(['p/b RUNNING']);
  });
});

describe('changesOf', () => {
  it('reads the records from the feed\'s field, and takes a message without any', () => {
    expect(changesOf(BATCH_FEED, { batches: [{ id: 'x' }], seq: 4, reset: false })).toEqual({ records: [{ id: 'x' }], seq: 4, reset: false });
    const none = changesOf(JOB_FEED, { seq: 3, reset: true });
    const list = applyChanges(emptyList<Job>(), none, JOB_FEED, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[], 3, true]);
  });
});

describe('position', () => {
  it('finds a record, or where it goes, in the feed\'s order', () => {
    const jobs = [job(9), job(7), job(5)];
    expect(position(jobs, job(7), JOB_FEED.order)).toEqual({ index: 1, found: true });
    expect(position(jobs, job(10), JOB_FEED.order)).toEqual({ index: 0, found: false });
    expect(position(jobs, job(6), JOB_FEED.order)).toEqual({ index: 2, found: false });
    expect(position(jobs, job(1), JOB_FEED.order)).toEqual({ index: 3, found: false });
    expect(position([], job(1), JOB_FEED.order)).toEqual({ index: 0, found: false });
  });
});
