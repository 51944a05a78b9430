// A sweep's shapes for drawing: the best objective so far by trial, and each trial's position on
// the parallel-coordinates axes.

import { configValue, toNumber } from './numbers';
import type { Trial } from './types';

/** For trials in index order: the best value up to and including each one (null before any). */
export function bestSoFar(trials: Trial[], goal: string): { index: number[]; value: (number | null)[]; best: (number | null)[] } {
  const sorted = [...trials].sort((a, b) => a.index - b.index);
  const maximize = goal === 'maximize';
  let best: number | null = null;
  const out = { index: [] as number[], value: [] as (number | null)[], best: [] as (number | null)[] };
  for (const trial of sorted) {
    const value = trial.value === undefined ? NaN : toNumber(trial.value);
    const finite = Number.isFinite(value);
    if (finite && (best === null || (maximize ? value > best : value < best))) best = value;
    out.index.push(trial.index);
    out.value.push(finite ? value : null);
    out.best.push(best);
  }
  return out;
}

/** An axis whose values span this factor or more is drawn on a log scale. */
const LOG_SPREAD = 100;

export interface Axis {
  key: string;
  /** A config key's axis, or the objective's (the trial's value). */
  kind: 'config' | 'objective';
  /** Numeric axes scale between min and max; categorical ones spread their values evenly. */
  categories?: string[];
  /** Spread over orders of magnitude (a learning rate): positions are read on a log scale. */
  log?: boolean;
  min: number;
  max: number;
}

/** One axis per config key (then the objective), fitted to the trials' values. */
export function parallelAxes(trials: Trial[], objective: string): Axis[] {
  const keys = [...new Set(trials.flatMap((trial) => Object.keys(trial.config ?? {})))].sort();
  const axes: Axis[] = keys.map((key) => {
    const values = trials.map((trial) => configValue(trial.config?.[key])).filter((v) => v !== undefined);
    if (values.every((v) => typeof v === 'number')) {
      const numbers = values as number[];
      const min = Math.min(...numbers);
      const max = Math.max(...numbers);
      return { key, kind: 'config' as const, min, max, log: min > 0 && max / min >= LOG_SPREAD };
    }
    const categories = [...new Set(values.map(String))].sort();
    return { key, kind: 'config' as const, categories, min: 0, max: Math.max(1, categories.length - 1) };
  });
  const objectiveValues = trials.map((trial) => toNumber(trial.value)).filter(Number.isFinite);
  if (objectiveValues.length > 0) axes.push({ key: objective, kind: 'objective', min: Math.min(...objectiveValues), max: Math.max(...objectiveValues) });
  return axes;
}

/** A trial's position on an axis, 0 (bottom) to 1 (top); undefined when it has no value there. */
export function axisPosition(axis: Axis, trial: Trial): number | undefined {
  const value = axis.kind === 'objective' ? (trial.value === undefined ? undefined : toNumber(trial.value)) : configValue(trial.config?.[axis.key]);
  if (value === undefined || (typeof value === 'number' && !Number.isFinite(value))) return undefined;
  if (axis.max === axis.min) return 0.5;
  if (axis.categories) return (axis.categories.indexOf(String(value)) - axis.min) / (axis.max - axis.min);
  if (axis.log) return Math.log(Number(value) / axis.min) / Math.log(axis.max / axis.min);
  return (Number(value) - axis.min) / (axis.max - axis.min);
}
