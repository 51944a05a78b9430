// The Runs table's model: its columns, how a row is filtered and sorted. Metric values are
// each run's latest and best, kept by job id then key: both come from one QueryMetrics call
// asking for a single band over the whole series (its last, lowest and highest value).

import { comparedKeys, matches, type Term } from './filter';
import { configValue, toNumber } from './numbers';
import { jobDurationMs } from './format';
import type { Job, MetricSeries } from './types';

export type Latest = Map<string, Map<string, number>>;

/** Metric values by job then key: the latest, and the best (lowest or highest, by metricGoal). */
export interface RunMetrics {
  latest: Latest;
  best: Latest;
}

export type SortKey =
  | { kind: 'field'; field: 'state' | 'name' | 'id' | 'user' | 'project' | 'duration' | 'cost' | 'created' }
  | { kind: 'config' | 'metric' | 'best'; key: string };

/** Whether lower or higher values of a metric are better. A key that reads as an error (loss,
 * error, mse, perplexity, latency, …) is best at its lowest; any other (accuracy, f1, reward,
 * throughput, …) at its highest. */
export function metricGoal(key: string): 'min' | 'max' {
  return LOWER_IS_BETTER.test(key) ? 'min' : 'max';
}
const LOWER_IS_BETTER = /loss|err|mse|mae|rmse|mape|nll|perplexity|ppl|wer|cer|latency|regret|divergence/i;

/** `best(loss)` in a filter or sort names the best value of `loss`; the inner key, else undefined. */
export function bestOf(key: string): string | undefined {
  return /^best\((.+)\)$/.exec(key)?.[1];
}

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

/** A run's value for a filter key: its config value first, else its latest metric, or the
 * best one for `best(key)`. */
export function keyedValue(job: Job, metrics: RunMetrics, key: string): number | string | boolean | undefined {
  const config = configValue(job.config?.[key]);
  if (config !== undefined) return config;
  const best = bestOf(key);
  return best === undefined ? metrics.latest.get(job.id)?.get(key) : metrics.best.get(job.id)?.get(best);
}

/** `userNames` maps owner ids to names where known (all of them for the admin). */
export function filterJobs(jobs: Job[], terms: Term[], metrics: RunMetrics, userNames: Map<string, string> = new Map()): Job[] {
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
      value: (key) => keyedValue(job, metrics, key),
    }),
  );
}

function sortValue(job: Job, key: SortKey, metrics: RunMetrics, nowMs: number): number | string | boolean | undefined {
  if (key.kind === 'config') return configValue(job.config?.[key.key]);
  if (key.kind === 'metric') return metrics.latest.get(job.id)?.get(key.key);
  if (key.kind === 'best') return metrics.best.get(job.id)?.get(key.key);
  if (key.kind !== 'field') return undefined;
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
export function sortJobs(jobs: Job[], sort: Sort, metrics: RunMetrics, nowMs: number): Job[] {
  const keyed = jobs.map((job) => ({ job, value: sortValue(job, sort.key, metrics, nowMs) }));
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

/** The metric keys whose values every run needs, not only the rows in view: those a filter
 * compares (that are not config columns) and the one sorted on, split into latest and best. */
export function keysForAllRuns(terms: Term[], sort: SortKey, configKeys: string[]): { latest: string[]; best: string[] } {
  const latest = new Set<string>();
  const best = new Set<string>();
  for (const key of comparedKeys(terms)) {
    if (configKeys.includes(key)) continue;
    const inner = bestOf(key);
    if (inner === undefined) latest.add(key);
    else best.add(inner);
  }
  if (sort.kind === 'metric') latest.add(sort.key);
  if (sort.kind === 'best') best.add(sort.key);
  return { latest: [...latest].sort(), best: [...best].sort() };
}

/** Stores the single whole-series band of each series (QueryMetrics with bands and one bucket)
 * as the run's latest and best value of that key. */
export function storeSummaries(metrics: RunMetrics, series: MetricSeries[]): void {
  for (const one of series) {
    const bands = one.bands;
    const last = bands ? bands.steps.length - 1 : -1;
    if (!bands || last < 0) continue;
    const extreme = metricGoal(one.key) === 'min' ? bands.mins[last] : bands.maxs[last];
    valuesOf(metrics.latest, one.jobId).set(one.key, toNumber(bands.lasts[last]));
    valuesOf(metrics.best, one.jobId).set(one.key, toNumber(extreme));
  }
}

/** Stores each series' last point (LatestMetrics) as the run's latest value of that key. */
export function storeLatest(metrics: RunMetrics, series: MetricSeries[]): void {
  for (const one of series) {
    const point = one.points[one.points.length - 1];
    if (point) valuesOf(metrics.latest, one.jobId).set(one.key, toNumber(point.value));
  }
}

function valuesOf(values: Latest, jobId: string): Map<string, number> {
  let map = values.get(jobId);
  if (!map) values.set(jobId, (map = new Map()));
  return map;
}
