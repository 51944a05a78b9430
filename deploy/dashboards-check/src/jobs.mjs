// The overview, scheduler and runners dashboards.
import { dashboard, q, quantiles, stat, timeseries, heatmap } from './build.mjs';

const POOL = '{pool=~"$pool"}';
/**
 * `rate()` of `kiln_<svc>_<what>` summed over every service. A plain `rate({__name__=~...})` fails
 * ("vector cannot contain metrics with the same labelset") where two services' series differ by
 * name only, as under `kiln up`'s one endpoint; so the name is first copied into a `service` label,
 * which needs a subquery (at 15 s, whatever the global evaluation interval).
 */
const rateOfEvery = (what, filter = '') =>
  `rate(label_replace({__name__=~"kiln_[a-z_]+_${what}"${filter}}, "service", "$1", "__name__", "kiln_(.+)_${what}")[$__rate_interval:15s])`;
const ABSENT_UNTIL = (what) =>
  ` Reads 0 (\`or vector(0)\`) while no ${what} has happened yet: the series exists from the first one on.`;

/** Used share of `resource` per pool: held by placed jobs over what the pool's runners report. */
const utilisation = (resource) =>
  `(sum by (pool) (kiln_scheduler_held{resource="${resource}",pool=~"$pool"}) or sum by (pool) (kiln_scheduler_capacity{resource="${resource}",pool=~"$pool"}) * 0) / sum by (pool) (kiln_scheduler_capacity{resource="${resource}",pool=~"$pool"})`;

export const overview = dashboard({
  uid: 'kiln-overview',
  title: 'kiln / Overview',
  description: 'Jobs by state, queue wait, utilisation by pool, spend by market, RPC traffic of every kiln service',
  sections: [
    [
      'Jobs',
      [
        stat('Services reporting', 'kiln processes whose /metrics Prometheus scraped, by job and version (`kiln_<svc>_build_info` = 1 each)', [
          q('sum by (job, version) ({__name__=~"kiln_[a-z_]+_build_info"})', '{{job}} {{version}}'),
        ], { width: 8 }),
        stat('Jobs not ended', 'Jobs in QUEUED..SYNCING, as of the api reconciler\'s last pass', [q(`sum(kiln_api_jobs${POOL})`, 'jobs')], { width: 4 }),
        stat('Scheduler leader', '1 when a scheduler holds the lead; 0 means nothing is placed', [q('sum(kiln_scheduler_leader)', 'leaders')], { width: 4 }),
        stat('Spend in range', 'Dollars of attempts that ended in the dashboard\'s time range, by market', [
          q(`sum by (market) (increase(kiln_runner_spend_dollars_total${POOL}[$__range]))`, '{{market}}'),
        ], { width: 8, unit: 'currencyUSD', decimals: 2 }),
        timeseries('Jobs by state', 'Jobs not yet ended, by state (kiln_api_jobs; a pool-less queued job counts under pool "any")', [
          q(`sum by (state) (kiln_api_jobs${POOL})`, '{{state}}'),
        ], { stack: true }),
        timeseries('Job transitions', 'State changes per second, by the state moved to, summed over every service that records them', [
          q(`sum by (state) (${rateOfEvery('job_transitions_total')})`, '{{state}}'),
        ], { unit: 'ops' }),
        timeseries('Jobs submitted', 'Jobs accepted by SubmitJob per second, by project', [
          q('sum by (project) (rate(kiln_api_jobs_submitted_total{project=~"$project"}[$__rate_interval]))', '{{project}}'),
        ], { unit: 'ops' }),
        timeseries('Queue wait', 'Time from QUEUED to placed, p50/p95/p99 per pool (kiln_scheduler_queue_wait_seconds)', quantiles(
          'kiln_scheduler_queue_wait_seconds_bucket', POOL, 'pool',
        ), { unit: 's' }),
      ],
    ],
    [
      'Capacity and spend',
      [
        timeseries('CPU utilisation by pool', 'Cores held by placed jobs over the cores the pool\'s runners report. Reads 0 for a pool with nothing placed (no held series yet).', [
          q(utilisation('cpu'), '{{pool}}'),
        ], { unit: 'percentunit', min: 0 }),
        timeseries('Memory utilisation by pool', 'Memory held by placed jobs over the memory the pool\'s runners report. Reads 0 for a pool with nothing placed.', [
          q(utilisation('memory'), '{{pool}}'),
        ], { unit: 'percentunit', min: 0 }),
        timeseries('Running jobs by market', 'Placed jobs, spot vs on-demand', [
          q(`sum by (market) (kiln_scheduler_running_jobs${POOL})`, '{{market}}'),
        ], { stack: true }),
        timeseries('Spend rate by market', 'Dollars per hour of ended attempts, spot vs on-demand (kiln_runner_spend_dollars_total)', [
          q(`sum by (market) (rate(kiln_runner_spend_dollars_total${POOL}[$__rate_interval])) * 3600`, '{{market}}'),
        ], { unit: 'currencyUSD' }),
      ],
    ],
    [
      'RPCs',
      [
        timeseries('RPC requests', 'gRPC calls received per second, by service and method', [
          q(`sum by (grpc_service, grpc_method) (${rateOfEvery('rpc_requests_total')})`, '{{grpc_service}}/{{grpc_method}}'),
        ], { unit: 'reqps', width: 8 }),
        timeseries('RPC errors', 'gRPC calls answered with a code other than OK, per second, by service and code.' + ABSENT_UNTIL('error'), [
          q(`sum by (grpc_service, grpc_code) (${rateOfEvery('rpc_errors_total')}) or vector(0)`, '{{grpc_service}} {{grpc_code}}'),
        ], { unit: 'reqps', width: 8 }),
        timeseries('RPC latency p95', 'p95 of gRPC call durations, by service', [
          q(`histogram_quantile(0.95, sum by (le, grpc_service) (${rateOfEvery('rpc_duration_seconds_bucket')}))`, '{{grpc_service}}'),
        ], { unit: 's', width: 8 }),
      ],
    ],
  ],
});

export const scheduler = dashboard({
  uid: 'kiln-scheduler',
  title: 'kiln / Scheduler',
  description: 'Scheduling passes, pending and running jobs, held resources against capacity, placements, quota refusals and preemptions',
  sections: [
    [
      'Passes',
      [
        stat('Leader', 'Schedulers holding the lead (sum of kiln_scheduler_leader): 1 is healthy', [q('sum(kiln_scheduler_leader)', 'leaders')]),
        stat('Pending jobs', 'QUEUED jobs after the last pass', [q(`sum(kiln_scheduler_pending_jobs${POOL})`, 'pending')]),
        stat('Running jobs', 'Placed jobs', [q(`sum(kiln_scheduler_running_jobs${POOL})`, 'running')]),
        stat('Lost jobs', 'Jobs of runners whose lease lapsed, ended or queued again by the leader, in the time range', [q('sum(increase(kiln_scheduler_lost_jobs_total[$__range]))', 'lost')]),
        timeseries('Passes', 'Scheduling passes per second', [q('sum(rate(kiln_scheduler_passes_total[$__rate_interval]))', 'passes')], { unit: 'ops' }),
        timeseries('Pass duration', 'Duration of a scheduling pass, p50/p95/p99', quantiles('kiln_scheduler_pass_duration_seconds_bucket'), { unit: 's' }),
      ],
    ],
    [
      'Jobs',
      [
        timeseries('Pending jobs by pool', 'QUEUED jobs after each pass, by pool', [q(`sum by (pool) (kiln_scheduler_pending_jobs${POOL})`, '{{pool}}')], { stack: true }),
        timeseries('Running jobs by pool and market', 'Placed jobs, by pool and market', [
          q(`sum by (pool, market) (kiln_scheduler_running_jobs${POOL})`, '{{pool}} {{market}}'),
        ], { stack: true }),
        timeseries('Placements', 'Jobs placed per second, by pool and market', [
          q(`sum by (pool, market) (rate(kiln_scheduler_placements_total${POOL}[$__rate_interval]))`, '{{pool}} {{market}}'),
        ], { unit: 'ops' }),
        heatmap('Queue wait', 'Distribution of QUEUED -> placed times (kiln_scheduler_queue_wait_seconds buckets)', [
          q(`sum by (le) (rate(kiln_scheduler_queue_wait_seconds_bucket${POOL}[$__rate_interval]))`, '{{le}}'),
        ], { unit: 's' }),
      ],
    ],
    [
      'Resources',
      [
        timeseries('CPU held and capacity', 'Cores held by placed jobs and cores the runners report, by pool', [
          q(`sum by (pool) (kiln_scheduler_held{resource="cpu",pool=~"$pool"})`, '{{pool}} held'),
          q(`sum by (pool) (kiln_scheduler_capacity{resource="cpu",pool=~"$pool"})`, '{{pool}} capacity'),
        ], { width: 8 }),
        timeseries('Memory held and capacity', 'Bytes held by placed jobs and bytes the runners report, by pool', [
          q(`sum by (pool) (kiln_scheduler_held{resource="memory",pool=~"$pool"})`, '{{pool}} held'),
          q(`sum by (pool) (kiln_scheduler_capacity{resource="memory",pool=~"$pool"})`, '{{pool}} capacity'),
        ], { unit: 'bytes', width: 8 }),
        timeseries('GPUs held and capacity', 'GPUs held by placed jobs and GPUs the runners report, by pool', [
          q(`sum by (pool) (kiln_scheduler_held{resource="gpu",pool=~"$pool"})`, '{{pool}} held'),
          q(`sum by (pool) (kiln_scheduler_capacity{resource="gpu",pool=~"$pool"})`, '{{pool}} capacity'),
        ], { width: 8 }),
        timeseries('Quota refusals', 'Placements refused by a quota per second, by scope kind.' + ABSENT_UNTIL('refusal'), [
          q('sum by (scope) (rate(kiln_scheduler_quota_refusals_total[$__rate_interval])) or vector(0)', '{{scope}}'),
        ], { unit: 'ops' }),
        timeseries('Preemptions', 'Jobs preempted per second, by cause.' + ABSENT_UNTIL('preemption'), [
          q('sum by (cause) (rate(kiln_scheduler_preemptions_total[$__rate_interval])) or vector(0)', '{{cause}}'),
        ], { unit: 'ops' }),
      ],
    ],
  ],
});

export const runners = dashboard({
  uid: 'kiln-runners',
  title: 'kiln / Runners and instances',
  description: 'Instances by state, launches and their latency, stops by reason, outputs synced, provider errors, spend',
  sections: [
    [
      'Instances',
      [
        timeseries('Instances by state', 'Instances the runners hold, by state', [q(`sum by (state) (kiln_runner_instances${POOL})`, '{{state}}')], { stack: true }),
        timeseries('Instances by pool', 'Instances the runners hold, by pool', [q(`sum by (pool) (kiln_runner_instances${POOL})`, '{{pool}}')], { stack: true }),
        timeseries('Launches', 'Launch requests per second, by pool', [
          q(`sum by (pool) (rate(kiln_runner_launches_total${POOL}[$__rate_interval]))`, '{{pool}}'),
        ], { unit: 'ops' }),
        timeseries('Launch latency', 'Launch request received -> RUNNING, p50/p95/p99 by pool', quantiles('kiln_runner_launch_duration_seconds_bucket', POOL, 'pool'), { unit: 's' }),
        timeseries('Stops by reason', 'Instances stopped per second, by reason', [
          q(`sum by (reason) (rate(kiln_runner_stops_total${POOL}[$__rate_interval]))`, '{{reason}}'),
        ], { unit: 'ops' }),
        timeseries('Idle-GPU kills', 'Jobs stopped for leaving their GPUs idle, per second, by pool.' + ABSENT_UNTIL('idle-GPU kill'), [
          q(`sum by (pool) (rate(kiln_runner_idle_gpu_kills_total${POOL}[$__rate_interval])) or vector(0)`, '{{pool}}'),
        ], { unit: 'ops' }),
      ],
    ],
    [
      'Outputs, errors and spend',
      [
        timeseries('Outputs synced', 'Bytes of job outputs uploaded per second, by pool.' + ABSENT_UNTIL('output sync'), [
          q(`sum by (pool) (rate(kiln_runner_outputs_synced_bytes_total${POOL}[$__rate_interval])) or vector(0)`, '{{pool}}'),
        ], { unit: 'Bps' }),
        timeseries('Outputs sync duration', 'Time to sync an attempt\'s outputs, p50/p95/p99 by pool.' + ABSENT_UNTIL('output sync'), quantiles(
          'kiln_runner_outputs_sync_duration_seconds_bucket', POOL, 'pool', true,
        ), { unit: 's' }),
        timeseries('Provider errors', 'Errors from the instance provider per second, by pool and provider.' + ABSENT_UNTIL('provider error'), [
          q(`sum by (pool, provider) (rate(kiln_runner_provider_errors_total${POOL}[$__rate_interval])) or vector(0)`, '{{pool}} {{provider}}'),
        ], { unit: 'ops' }),
        timeseries('Spend by pool and market', 'Dollars per hour of ended attempts, by pool and market', [
          q(`sum by (pool, market) (rate(kiln_runner_spend_dollars_total${POOL}[$__rate_interval])) * 3600`, '{{pool}} {{market}}'),
        ], { unit: 'currencyUSD' }),
      ],
    ],
  ],
});
