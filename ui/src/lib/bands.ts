// Shapes QueryMetrics answers into uPlot's columnar data. uPlot draws `null` as a gap, so
// non-finite values (NaN, the gateway's "NaN"/"Infinity" strings) become null: a chart has no
// place to put them.

import { toNumber } from './numbers';
import type { JsonDouble, MetricBands } from './types';

/** uPlot data of one run's chart: x (steps), then the line (lasts), the band's low and high. */
export type BandData = [number[], (number | null)[], (number | null)[], (number | null)[]];

function finiteOrNull(value: JsonDouble | number | undefined): number | null {
  const number = toNumber(value);
  return Number.isFinite(number) ? number : null;
}

/** Converts a series' bands; an absent or malformed column gives empty data rather than a throw. */
export function bandsToData(bands: MetricBands | undefined): BandData {
  const steps = bands?.steps ?? [];
  const length = Math.min(steps.length, bands?.lasts?.length ?? 0);
  const xs: number[] = new Array(length);
  const lasts: (number | null)[] = new Array(length);
  const mins: (number | null)[] = new Array(length);
  const maxs: (number | null)[] = new Array(length);
  for (let i = 0; i < length; i++) {
    xs[i] = Number(steps[i]);
    lasts[i] = finiteOrNull(bands!.lasts[i]);
    mins[i] = finiteOrNull(bands!.mins?.[i]);
    maxs[i] = finiteOrNull(bands!.maxs?.[i]);
  }
  return [xs, lasts, mins, maxs];
}

/**
 * One run's line (its buckets' last values) as x and y columns: x is the step, or the time of
 * the bucket's last point in seconds (uPlot's time unit). Time x values are made strictly
 * increasing (two buckets written in one millisecond), as uPlot needs.
 */
export function bandsToColumns(bands: MetricBands | undefined, x: 'step' | 'time'): [number[], (number | null)[]] {
  const [steps, lasts] = bandsToData(bands);
  if (x === 'step') return [steps, lasts];
  const xs: number[] = [];
  const ys: (number | null)[] = [];
  for (let i = 0; i < steps.length; i++) {
    const at = Number(bands!.timestampsMs?.[i] ?? 0) / 1000;
    if (xs.length > 0 && at <= xs[xs.length - 1]) {
      ys[ys.length - 1] = lasts[i];
      continue;
    }
    xs.push(at);
    ys.push(lasts[i]);
  }
  return [xs, ys];
}

/**
 * Aligns several series with their own x values onto one x column (the union, ascending),
 * filling null where a series has no point: uPlot's data layout for overlaid runs.
 */
export function alignSeries(series: [number[], (number | null)[]][]): [number[], ...(number | null)[][]] {
  const all = new Set<number>();
  for (const [xs] of series) for (const x of xs) all.add(x);
  const xs = [...all].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const columns = series.map(([sx, sy]) => {
    const column: (number | null)[] = new Array(xs.length).fill(null);
    for (let i = 0; i < sx.length; i++) column[index.get(sx[i])!] = sy[i];
    return column;
  });
  return [xs, ...columns];
}
