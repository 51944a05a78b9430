// Lists kept current by a change feed (docs/http-api.md): JobService/WatchJobs,
// BatchService/WatchBatches, SweepService/WatchSweeps and ServeService/WatchServices each send
// first the records their List method would answer, in pages, then each record again (whole)
// when it changed. Here is how one message changes a list; lib/watch.ts holds the stream.

import type { Batch, Job, Service, Sweep } from './types';

/** One message of a feed: records listed or changed (each whole), the sequence the list is
 * current to (0 on the first list's pages but its last), and whether the list starts over (its
 * first page, or a resume the server could not replay). */
export interface Changes<T> {
  records: T[];
  seq: number;
  reset: boolean;
}

export interface LiveList<T> {
  /** In the feed's order, at most the limit, no record twice. */
  records: T[];
  /** The sequence the list is current to; 0 until the first list has arrived whole. */
  seq: number;
  /** Whether the first list (or the list since the last reset) has arrived whole. */
  complete: boolean;
}

/** A feed: its methods, and the order and identity of its records. */
export interface ListFeed<T> {
  service: string;
  /** The server-streaming method, and the unary one that answers its first list. */
  watch: string;
  list: string;
  /** The field of their messages that holds the records (`jobs`). */
  field: string;
  /** The list's order, as the List method's (negative: `a` comes first), over fields a record
   * never changes; 0 for the same record only, so it says which row a record replaces. */
  order: (a: T, b: T) => number;
  /** Whether `next` replaces `current`, the same record; absent: always (the last one received
   * wins, the feed being one ordered stream). */
  replaces?: (next: T, current: T) => boolean;
}

export interface FeedOptions<T> {
  /** The most records the list holds (unbounded when absent): the last in order go beyond it,
   * as a List method's `limit` cuts them. */
  limit?: number;
  /** Which records the list shows (all when absent): a list of live ones drops the ended ones,
   * which the feed sends too. */
  keep?: (record: T) => boolean;
}

function ascending(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Newest first by id: ids are UUIDv7, so that is by creation. */
function newestId(a: { id: string }, b: { id: string }): number {
  return ascending(b.id, a.id);
}

/** Jobs newest first, as ListJobs orders them; a job never goes back to an earlier version (a
 * state change bumps it). */
export const JOB_FEED: ListFeed<Job> = {
  service: 'JobService',
  watch: 'WatchJobs',
  list: 'ListJobs',
  field: 'jobs',
  order: newestId,
  replaces: (next, current) => current.version <= next.version,
};

/** Batches newest first, as ListBatches orders them. */
export const BATCH_FEED: ListFeed<Batch> = {
  service: 'BatchService',
  watch: 'WatchBatches',
  list: 'ListBatches',
  field: 'batches',
  order: newestId,
};

/** Sweeps newest first by their creation time, as ListSweeps orders them (the id for a tie). */
export const SWEEP_FEED: ListFeed<Sweep> = {
  service: 'SweepService',
  watch: 'WatchSweeps',
  list: 'ListSweeps',
  field: 'sweeps',
  order: (a, b) => b.createdAtMs - a.createdAtMs || newestId(a, b),
};

/** Services by name then project, as ListServices orders them: a service is its project and
 * its name (it has no id). */
export const SERVICE_FEED: ListFeed<Service> = {
  service: 'ServeService',
  watch: 'WatchServices',
  list: 'ListServices',
  field: 'services',
  order: (a, b) => ascending(a.name, b.name) || ascending(a.project, b.project),
};

/** A message of a feed as the API sends it: its records in the feed's `field` (absent when none). */
export type FeedMessage = { seq: number; reset: boolean; [field: string]: unknown };

/** What a message of `feed` changes. */
export function changesOf<T>(feed: ListFeed<T>, message: FeedMessage): Changes<T> {
  return { records: (message[feed.field] as T[] | undefined) ?? [], seq: message.seq, reset: message.reset };
}

export function emptyList<T>(): LiveList<T> {
  return { records: [], seq: 0, complete: false };
}

/**
 * Applies one message to `list` and returns the new list (`list` is not changed): a reset drops
 * every record first; a record replaces the same one (unless the feed says that one is later)
 * or goes where it sorts when new; the last in order beyond the limit go.
 */
export function applyChanges<T>(list: LiveList<T>, changes: Changes<T>, feed: ListFeed<T>, options: FeedOptions<T> = {}): LiveList<T> {
  const records = changes.reset ? [] : list.records.slice();
  for (const record of changes.records) {
    const { index, found } = position(records, record, feed.order);
    const kept = options.keep?.(record) ?? true;
    if (found) {
      if (!kept) records.splice(index, 1);
      else if (feed.replaces?.(record, records[index]) ?? true) records[index] = record;
    } else if (kept) {
      records.splice(index, 0, record);
    }
  }
  if (options.limit !== undefined && records.length > options.limit) records.length = Math.max(0, options.limit);
  const seq = changes.seq || (changes.reset ? 0 : list.seq);
  const complete = changes.seq !== 0 || (!changes.reset && list.complete);
  return { records, seq, complete };
}

/** Where `record` is in `records` (sorted by `order`), or where it would go: a binary search. */
export function position<T>(records: T[], record: T, order: (a: T, b: T) => number): { index: number; found: boolean } {
  let low = 0;
  let high = records.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    const compared = order(records[middle], record);
    if (compared === 0) return { index: middle, found: true };
    if (compared < 0) low = middle + 1;
    else high = middle;
  }
  return { index: low, found: false };
}
