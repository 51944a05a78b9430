// A service's recent requests (Service.recent: the answering predictor's last five minutes) as
// the Services page shows them.

import type { ServiceTraffic } from './types';

export interface TrafficCells {
  /** Requests per second over the window. */
  rate: string;
  /** p50 / p95 / p99 latency. */
  latency: string;
  /** Shares of the requests answered without some members, and failed (invalid ones apart). */
  partial: string;
  failed: string;
}

/** Empty cells ('—') when the service had no request in the window. */
export function trafficCells(recent: ServiceTraffic | undefined): TrafficCells {
  if (!recent || recent.requests === 0 || recent.windowSeconds <= 0) return { rate: '—', latency: '—', partial: '—', failed: '—' };
  const share = (n: number) => `${percent(n / recent.requests)}`;
  return {
    rate: `${perSecond(recent.requests / recent.windowSeconds)}/s`,
    latency: [recent.p50Ms, recent.p95Ms, recent.p99Ms].map(ms).join(' / '),
    partial: share(recent.partial),
    failed: share(recent.failed + recent.invalid),
  };
}

function perSecond(rate: number): string {
  return rate >= 10 ? rate.toFixed(0) : rate >= 0.1 ? rate.toFixed(1) : rate.toFixed(3);
}

function percent(fraction: number): string {
  if (fraction === 0) return '0%';
  const value = fraction * 100;
  return value < 0.1 ? '<0.1%' : `${value < 10 ? value.toFixed(1) : value.toFixed(0)}%`;
}

function ms(value: number): string {
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : value >= 10 ? `${value.toFixed(0)} ms` : `${value.toFixed(1)} ms`;
}
