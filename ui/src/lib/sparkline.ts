// A small step chart of a count over time (a batch's workers while its page is open), as an SVG
// path: each value holds until the next sample.

export interface Point {
  atMs: number;
  value: number;
}

/** Keeps the samples of the last `windowMs` before the newest. */
export function keepRecent(points: Point[], point: Point, windowMs: number): Point[] {
  return [...points, point].filter((p) => point.atMs - p.atMs <= windowMs);
}

/**
 * The path of `points` in a `width` × `height` box: time left to right over the samples' span,
 * 0 at the bottom and the highest value (at least 1) at the top. Empty without two samples.
 */
export function stepPath(points: Point[], width: number, height: number): string {
  if (points.length < 2) return '';
  const first = points[0].atMs;
  const span = Math.max(1, points[points.length - 1].atMs - first);
  const top = Math.max(1, ...points.map((p) => p.value));
  const x = (atMs: number) => round((width * (atMs - first)) / span);
  const y = (value: number) => round(height - (height * value) / top);
  let path = `M${x(points[0].atMs)},${y(points[0].value)}`;
  for (let i = 1; i < points.length; i++) path += ` H${x(points[i].atMs)} V${y(points[i].value)}`;
  return path;
}

function round(n: number): number {
  return Math.round(n * 10) / 10;
}
