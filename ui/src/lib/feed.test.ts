import { describe, expect, it } from 'vitest';
import { applyChanges, emptyList, position, type JobChanges, type JobList } from './feed';
import type { Job, JobStateName } from './types';

/** A job whose id sorts by `n` (as UUIDv7 ids sort by creation). */
function job(n: number, state: JobStateName = 'JOB_STATE_RUNNING', version = 1): Job {
  return { id: `0193-${String(n).padStart(4, '0')}`, state, version } as Job;
}
const ids = (list: JobList) => list.jobs.map((one) => Number(one.id.slice(5)));
const states = (list: JobList) => list.jobs.map((one) => one.state);
const page = (jobs: Job[], seq = 0, reset = false): JobChanges => ({ jobs, seq, reset });
const options = { limit: 5 };

describe('applyChanges', () => {
  it('takes the first list in pages: shown from the first, complete with the last', () => {
    let list = applyChanges(emptyList(), page([job(9), job(8)], 0, true), options);
    expect([ids(list), list.seq, list.complete]).toEqual([[9, 8], 0, false]);
    list = applyChanges(list, page([job(7), job(6)], 0), options);
    expect([ids(list), list.complete]).toEqual([[9, 8, 7, 6], false]);
    list = applyChanges(list, page([job(5)], 42), options);
    expect([ids(list), list.seq, list.complete]).toEqual([[9, 8, 7, 6, 5], 42, true]);
  });

  it('replaces a changed job in its place and puts a new one where its id sorts', () => {
    const start = applyChanges(emptyList(), page([job(9), job(7), job(5)], 10, true), options);
    const list = applyChanges(start, page([job(7, 'JOB_STATE_SUCCEEDED', 2), job(10), job(6)], 11), options);
    expect(ids(list)).toEqual([10, 9, 7, 6, 5]);
    expect(list.jobs[2].state).toBe('JOB_STATE_SUCCEEDED');
    expect(list.seq).toBe(11);
    // The list given is not changed.
    expect(ids(start)).toEqual([9, 7, 5]);
    expect(start.jobs[1].state).toBe('JOB_STATE_RUNNING');
  });

  it('keeps the newest `limit` jobs: a new one pushes the oldest out, an older one is not taken', () => {
    let list = applyChanges(emptyList(), page([job(9), job(8), job(7), job(6), job(5)], 1, true), options);
    list = applyChanges(list, page([job(10)], 2), options);
    expect(ids(list)).toEqual([10, 9, 8, 7, 6]);
    list = applyChanges(list, page([job(3, 'JOB_STATE_FAILED', 2)], 3), options);
    expect(ids(list)).toEqual([10, 9, 8, 7, 6]);
  });

  it('drops everything on a reset, even after a complete list', () => {
    let list = applyChanges(emptyList(), page([job(9), job(8)], 5, true), options);
    list = applyChanges(list, page([job(4)], 0, true), options);
    expect([ids(list), list.seq, list.complete]).toEqual([[4], 0, false]);
    list = applyChanges(list, page([job(3)], 80), options);
    expect([ids(list), list.seq, list.complete]).toEqual([[4, 3], 80, true]);
    // A reset that is also the whole list (one page) is complete at once.
    list = applyChanges(list, page([job(2)], 90, true), options);
    expect([ids(list), list.seq, list.complete]).toEqual([[2], 90, true]);
  });

  it('never goes back to an earlier version of a job', () => {
    let list = applyChanges(emptyList(), page([job(9, 'JOB_STATE_SUCCEEDED', 4)], 5, true), options);
    list = applyChanges(list, page([job(9, 'JOB_STATE_RUNNING', 3)]), options);
    expect(states(list)).toEqual(['JOB_STATE_SUCCEEDED']);
    // The same version again (a run's config read anew) replaces it.
    const again = { ...job(9, 'JOB_STATE_SUCCEEDED', 4), reason: 'again' };
    list = applyChanges(list, page([again]), options);
    expect(list.jobs[0].reason).toBe('again');
    // A message without a seq (such a read) keeps the list's.
    expect(list.seq).toBe(5);
  });

  it('drops the jobs a list does not keep (a list of live ones: the ended)', () => {
    const live = { limit: 5, keep: (one: Job) => one.state !== 'JOB_STATE_SUCCEEDED' };
    let list = applyChanges(emptyList(), page([job(9), job(8)], 5, true), live);
    list = applyChanges(list, page([job(8, 'JOB_STATE_SUCCEEDED', 2), job(10, 'JOB_STATE_SUCCEEDED', 2)], 6), live);
    expect(ids(list)).toEqual([9]);
  });

  it('takes a message without jobs', () => {
    const list = applyChanges(emptyList(), { seq: 3, reset: true } as JobChanges, options);
    expect([ids(list), list.seq, list.complete]).toEqual([[], 3, true]);
  });

  it('keeps 10,000 jobs in order through a burst of changes', () => {
    const first = Array.from({ length: 10_000 }, (_, i) => job(2 * (10_000 - i)));
    let list = applyChanges(emptyList(), page(first.slice(0, 500), 0, true), { limit: 10_000 });
    for (let at = 500; at < first.length; at += 500) list = applyChanges(list, page(first.slice(at, at + 500), at === 9_500 ? 1 : 0), { limit: 10_000 });
    expect(list.jobs.length).toBe(10_000);
    const changed = Array.from({ length: 300 }, (_, i) => job(2 * (i * 33 + 1) + (i % 2), 'JOB_STATE_FAILED', 2));
    list = applyChanges(list, page(changed, 2), { limit: 10_000 });
    expect(list.jobs.length).toBe(10_000);
    const sorted = list.jobs.every((one, i) => i === 0 || list.jobs[i - 1].id > one.id);
    expect(sorted).toBe(true);
    expect(new Set(list.jobs.map((one) => one.id)).size).toBe(10_000);
  });
});

describe('position', () => {
  it('finds an id, or where it goes, newest first', () => {
    const jobs = [job(9), job(7), job(5)];
    expect(position(jobs, job(7).id)).toEqual({ index: 1, found: true });
    expect(position(jobs, job(10).id)).toEqual({ index: 0, found: false });
    expect(position(jobs, job(6).id)).toEqual({ index: 2, found: false });
    expect(position(jobs, job(1).id)).toEqual({ index: 3, found: false });
    expect(position([], job(1).id)).toEqual({ index: 0, found: false });
  });
});
