// A batch's rate and ETA as the page sees them: from the change of the finished count between
// samples of its counters over a sliding window (the server's own rate is over a minute and
// the page may have watched for less).

export interface Sample {
  /** When the counters were read, in ms (any clock, as long as it is one clock). */
  atMs: number;
  /** Items finished (succeeded + dead) then. */
  done: number;
}

/** Keeps the samples of the last `windowMs` (and always the newest two, for a rate). */
export function addSample(samples: Sample[], sample: Sample, windowMs: number): Sample[] {
  const kept = [...samples, sample].filter((s) => sample.atMs - s.atMs <= windowMs);
  if (kept.length < 2 && samples.length > 0) return [samples[samples.length - 1], sample];
  return kept;
}

/** Items per second between the oldest and newest sample; undefined without two samples apart in time. */
export function rateOf(samples: Sample[]): number | undefined {
  if (samples.length < 2) return undefined;
  const first = samples[0];
  const last = samples[samples.length - 1];
  const seconds = (last.atMs - first.atMs) / 1000;
  if (seconds <= 0) return undefined;
  return Math.max(0, (last.done - first.done) / seconds);
}

/** Seconds until `remaining` items are done at `rate`; undefined when it cannot be told. */
export function etaSeconds(remaining: number, rate: number | undefined): number | undefined {
  if (remaining <= 0) return 0;
  if (rate === undefined || rate <= 0) return undefined;
  return Math.ceil(remaining / rate);
}
