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

export interface Axis {
  key: string;
  /** A config key's axis, or the objective's (the trial's value). */
  kind: 'config' | 'objective';
  /** Numeric axes scale between min and max; categorical ones spread their values evenly. */
  categories?: string[];
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
      return { key, kind: 'config' as const, min: Math.min(...numbers), max: Math.max(...numbers) };
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
  const at = axis.categories ? axis.categories.indexOf(String(value)) : Number(value);
  if (axis.max === axis.min) return 0.5;
  return (at - axis.min) / (axis.max - axis.min);
}
