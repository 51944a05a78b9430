// The Runs table's model: its columns, how a row is filtered and sorted. Metric values are
// each run's latest (LogService/LatestMetrics), kept by job id then key.

import { matches, type Term } from './filter';
import { configValue } from './numbers';
import { jobDurationMs } from './format';
import type { Job } from './types';

export type Latest = Map<string, Map<string, number>>;

export type SortKey =
  | { kind: 'field'; field: 'state' | 'name' | 'id' | 'user' | 'project' | 'duration' | 'cost' | 'created' }
  | { kind: 'config' | 'metric'; key: string };

export interface Sort {
  key: SortKey;
  descending: boolean;
}

/** Columns at most of each kind: a wide table stays readable (the filter reaches the others). */
export const MAX_CONFIG_COLUMNS = 8;
export const MAX_METRIC_COLUMNS = 8;

/** The config keys of the runs, most common first (ties by name). */
export function configColumns(jobs: Job[], max = MAX_CONFIG_COLUMNS): string[] {
  const counts = new Map<string, number>();
  for (const job of jobs) for (const key of Object.keys(job.config ?? {})) counts.set(key, (counts.get(key) ?? 0) + 1);
  return [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).slice(0, max).map(([key]) => key);
}

/** The metric keys with a latest value, system metrics (`sys/...`) left out, by name. */
export function metricColumns(latest: Latest, max = MAX_METRIC_COLUMNS): string[] {
  const keys = new Set<string>();
  for (const values of latest.values()) for (const key of values.keys()) if (!key.startsWith('sys/')) keys.add(key);
  return [...keys].sort().slice(0, max);
}

/** A run's value for a filter or sort key: its config value first, else its latest metric. */
export function keyedValue(job: Job, latest: Latest, key: string): number | string | boolean | undefined {
  const config = configValue(job.config?.[key]);
  if (config !== undefined) return config;
  return latest.get(job.id)?.get(key);
}

/** `userNames` maps owner ids to names where known (all of them for the admin). */
export function filterJobs(jobs: Job[], terms: Term[], latest: Latest, userNames: Map<string, string> = new Map()): Job[] {
  if (terms.length === 0) return jobs;
  return jobs.filter((job) =>
    matches(terms, {
      state: job.state,
      project: job.spec?.project ?? '',
      user: userNames.get(job.owner) ?? job.owner,
      userId: job.owner,
      sweep: job.sweepId,
      name: job.spec?.name ?? '',
      id: job.id,
      value: (key) => keyedValue(job, latest, key),
    }),
  );
}

function sortValue(job: Job, key: SortKey, latest: Latest, nowMs: number): number | string | boolean | undefined {
  if (key.kind !== 'field') return key.kind === 'config' ? configValue(job.config?.[key.key]) : latest.get(job.id)?.get(key.key);
  switch (key.field) {
    case 'state': return job.state;
    case 'name': return job.spec?.name ?? '';
    case 'id': return job.id;
    case 'user': return job.owner;
    case 'project': return job.spec?.project ?? '';
    case 'duration': return jobDurationMs(job, nowMs);
    case 'cost': return job.cost;
    case 'created': return job.createdAtMs;
  }
}

/** Sorts a copy; runs without a value (or a NaN) go last in either direction. */
export function sortJobs(jobs: Job[], sort: Sort, latest: Latest, nowMs: number): Job[] {
  const keyed = jobs.map((job) => ({ job, value: sortValue(job, sort.key, latest, nowMs) }));
  const sign = sort.descending ? -1 : 1;
  keyed.sort((a, b) => {
    const missingA = a.value === undefined || (typeof a.value === 'number' && Number.isNaN(a.value));
    const missingB = b.value === undefined || (typeof b.value === 'number' && Number.isNaN(b.value));
    if (missingA || missingB) return missingA === missingB ? 0 : missingA ? 1 : -1;
    if (typeof a.value === 'number' && typeof b.value === 'number') return sign * (a.value - b.value);
    return sign * String(a.value).localeCompare(String(b.value));
  });
  return keyed.map((entry) => entry.job);
}

export function sameSortKey(a: SortKey, b: SortKey): boolean {
  if (a.kind === 'field' && b.kind === 'field') return a.field === b.field;
  return a.kind === b.kind && (a as { key: string }).key === (b as { key: string }).key;
}
