// What every uPlot chart of the UI shares: theme colours (read from CSS, since a canvas cannot
// use var()), axes, the series palette, the `data-drawn` marker tests and benchmarks wait for,
// and mounting only once the chart scrolls into view.

import type uPlot from 'uplot';
import { cssColor } from './theme.svelte';

/** Series colours of overlaid runs, distinguishable in both themes. */
export const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#ff9da7', '#9c755f', '#bab0ac'];

export function seriesColor(index: number): string {
  return PALETTE[index % PALETTE.length];
}

/** The same colour, faint: the raw line behind a smoothed one. */
export function faint(color: string, alpha = 0.25): string {
  const n = parseInt(color.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
}

/** A chart's axes; `label` names the x axis (step axes only: time labels speak for themselves). */
export function axes(xLabel: 'step' | 'time', label = 'step'): uPlot.Axis[] {
  const stroke = cssColor('--muted');
  const grid = { stroke: cssColor('--grid'), width: 1 };
  const ticks = { stroke: cssColor('--grid'), width: 1 };
  return [
    {
      stroke, grid, ticks, label: xLabel === 'step' ? label : undefined, labelSize: 14, size: 36,
      // Steps read better as 200k than 200,000; times keep uPlot's own date labels.
      ...(xLabel === 'step' ? { values: (_u: uPlot, splits: number[]) => splits.map(compactNumber) } : {}),
    },
    { stroke, grid, ticks, size: 56, values: (_u, splits) => splits.map(compactNumber) },
  ];
}

/** Tick labels: 12k, 1.5M, 0.001, 1e-7. */
export function compactNumber(value: number | null): string {
  if (value === null || !Number.isFinite(value)) return '';
  const magnitude = Math.abs(value);
  if (magnitude >= 1e9) return `${+(value / 1e9).toFixed(2)}G`;
  if (magnitude >= 1e6) return `${+(value / 1e6).toFixed(2)}M`;
  if (magnitude >= 1e4) return `${+(value / 1e3).toFixed(1)}k`;
  if (magnitude !== 0 && magnitude < 1e-3) return value.toExponential(1);
  return String(+value.toPrecision(4));
}

/**
 * The draw hook that marks a chart's container once its data is on the canvas:
 * `data-drawn="true"` and `data-points` (the points of its x column).
 */
export function markDrawn(container: HTMLElement): (u: uPlot) => void {
  return (u) => {
    container.dataset.points = String(u.data[0]?.length ?? 0);
    container.dataset.drawn = 'true';
  };
}

/** Calls `onVisible` once, when the element first comes within a screen of the viewport. */
export function whenVisible(element: HTMLElement, onVisible: () => void): () => void {
  const observer = new IntersectionObserver(
    (entries) => {
      if (entries.some((entry) => entry.isIntersecting)) {
        observer.disconnect();
        onVisible();
      }
    },
    { rootMargin: '200px 0px' },
  );
  observer.observe(element);
  return () => observer.disconnect();
}
