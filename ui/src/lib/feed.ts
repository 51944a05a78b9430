// A list of jobs kept current by JobService/WatchJobs (docs/http-api.md): the stream first
// sends the jobs ListJobs would answer, in pages, then each job again when its state changes.
// Here is how one message changes the list; the page holds the stream.

import type { Job } from './types';

/** One message of WatchJobs: `jobs` listed or changed (each whole), the KILN_JOBS sequence the
 * list is current to (0 on the first list's pages but its last), and whether the list starts
 * over (its first page, or a resume the server could not replay). */
export interface JobChanges {
  jobs: Job[];
  seq: number;
  reset: boolean;
}

export interface JobList {
  /** Newest first by id (ids are UUIDv7, so that is by creation, as ListJobs orders them),
   * at most the limit, no id twice. */
  jobs: Job[];
  /** The sequence the list is current to; 0 until the first list has arrived whole. */
  seq: number;
  /** Whether the first list (or the list since the last reset) has arrived whole. */
  complete: boolean;
}

export interface FeedOptions {
  /** The most jobs the list holds: the oldest go beyond it, as ListJobs' `limit` cuts them. */
  limit: number;
  /** Which jobs the list shows (all when absent): a list of live jobs drops the ended ones,
   * which the feed sends too. */
  keep?: (job: Job) => boolean;
}

export function emptyList(): JobList {
  return { jobs: [], seq: 0, complete: false };
}

/**
 * Applies one message to `list` and returns the new list (`list` is not changed): a reset drops
 * every job first; a job replaces the one with its id unless that one is of a later version
 * (a state change bumps it), or goes where its id sorts when new; the oldest beyond the limit go.
 */
export function applyChanges(list: JobList, changes: JobChanges, options: FeedOptions): JobList {
  const jobs = changes.reset ? [] : list.jobs.slice();
  for (const job of changes.jobs ?? []) {
    const { index, found } = position(jobs, job.id);
    const kept = options.keep?.(job) ?? true;
    if (found) {
      if (!kept) jobs.splice(index, 1);
      else if (jobs[index].version <= job.version) jobs[index] = job;
    } else if (kept) {
      jobs.splice(index, 0, job);
    }
  }
  if (jobs.length > options.limit) jobs.length = Math.max(0, options.limit);
  const seq = changes.seq || (changes.reset ? 0 : list.seq);
  const complete = changes.seq !== 0 || (!changes.reset && list.complete);
  return { jobs, seq, complete };
}

/** Where `id` is in `jobs` (newest first by id), or where it would go: a binary search. */
export function position(jobs: Job[], id: string): { index: number; found: boolean } {
  let low = 0;
  let high = jobs.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    const other = jobs[middle].id;
    if (other === id) return { index: middle, found: true };
    // Newest first: a larger id comes earlier.
    if (other > id) low = middle + 1;
    else high = middle;
  }
  return { index: low, found: false };
}
