// How values read on the page: durations, sizes, money, times and state names.

import type { JobStateName } from './types';

/** `JOB_STATE_RUNNING` -> `RUNNING` (any enum name: drops its type prefix). */
export function stateLabel(state: string): string {
  return state.replace(/^(JOB|BATCH|ITEM)_STATE_/, '').replace(/^ROLE_/, '');
}

const TERMINAL = new Set<JobStateName>(['JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_STOPPED', 'JOB_STATE_LOST']);

export function isTerminal(state: JobStateName): boolean {
  return TERMINAL.has(state);
}

/** A duration in ms as `1h 02m`, `3m 05s`, `12s`. */
export function duration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return '—';
  const seconds = Math.floor(ms / 1000);
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  if (h > 0) return `${h}h ${String(m).padStart(2, '0')}m`;
  if (m > 0) return `${m}m ${String(s).padStart(2, '0')}s`;
  return `${s}s`;
}

/** How long a job ran: to its end, or to `nowMs` while it runs; undefined before it started. */
export function jobDurationMs(job: { startedAtMs: number; finishedAtMs: number }, nowMs: number): number | undefined {
  if (!job.startedAtMs) return undefined;
  return (job.finishedAtMs || nowMs) - job.startedAtMs;
}

export function bytes(n: number | undefined): string {
  if (n === undefined || !Number.isFinite(n)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

export function money(n: number | undefined): string {
  if (n === undefined || !Number.isFinite(n)) return '—';
  return `$${n < 1 ? n.toFixed(4) : n.toFixed(2)}`;
}

export function timestamp(ms: number): string {
  if (!ms) return '—';
  const d = new Date(ms);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A metric or config value in a table cell: numbers to 4 significant digits. */
export function cellValue(value: number | string | boolean | undefined): string {
  if (value === undefined) return '';
  if (typeof value === 'number') {
    if (Number.isNaN(value)) return 'NaN';
    if (!Number.isFinite(value)) return value > 0 ? '∞' : '-∞';
    if (Number.isInteger(value)) return String(value);
    return Number(value.toPrecision(4)).toString();
  }
  return String(value);
}

export function cpu(millis: number | undefined): string {
  if (!millis) return '—';
  return `${millis / 1000} CPU`;
}

/** `ROLE_MAINTAINER` -> `maintainer`; `—` for none. */
export function roleLabel(role: string): string {
  return role === 'ROLE_UNSPECIFIED' || !role ? '—' : stateLabel(role).toLowerCase();
}
