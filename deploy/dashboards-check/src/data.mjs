// The ingest, NATS and batches dashboards.
import { dashboard, q, quantiles, stat, timeseries } from './build.mjs';

const INGEST_STREAMS = '{stream=~"KILN_METRICS|KILN_LOGS"}';
const DURABLE = '{consumer!="ephemeral"}';

export const ingest = dashboard({
  uid: 'kiln-ingest',
  title: 'kiln / Ingest',
  description: 'log-ingest: points and log lines received and stored, consumer lag, store write latency and errors',
  sections: [
    [
      'Throughput',
      [
        stat('Points per second', 'Points stored over the last ~5 s (kiln_log_ingest_points_per_second)', [
          q('sum(kiln_log_ingest_points_per_second)', 'points/s'),
        ], { unit: 'short' }),
        stat('Ingest lag', 'Messages on KILN_METRICS and KILN_LOGS not yet delivered to log-ingest', [
          q(`sum(kiln_nats_consumer_pending_messages${INGEST_STREAMS})`, 'pending'),
        ]),
        stat('Points stored in range', 'Points written to the store in the time range', [
          q('sum(increase(kiln_log_ingest_points_stored_total[$__range]))', 'points'),
        ]),
        stat('Log lines stored in range', 'Log lines written to the store in the time range', [
          q('sum(increase(kiln_log_ingest_log_lines_stored_total[$__range]))', 'lines'),
        ]),
        timeseries('Points', 'Metric points received from NATS and stored, per second', [
          q('sum(rate(kiln_log_ingest_points_received_total[$__rate_interval]))', 'received'),
          q('sum(rate(kiln_log_ingest_points_stored_total[$__rate_interval]))', 'stored'),
        ], { unit: 'ops' }),
        timeseries('Log lines', 'Log lines received from NATS and stored, per second', [
          q('sum(rate(kiln_log_ingest_log_lines_received_total[$__rate_interval]))', 'received'),
          q('sum(rate(kiln_log_ingest_log_lines_stored_total[$__rate_interval]))', 'stored'),
        ], { unit: 'ops' }),
      ],
    ],
    [
      'Lag and store',
      [
        timeseries('Consumer lag', 'Pending (not yet delivered) and ack-pending (delivered, not acknowledged) messages of log-ingest\'s consumers', [
          q(`sum by (stream, consumer) (kiln_nats_consumer_pending_messages${INGEST_STREAMS})`, '{{stream}} {{consumer}} pending'),
          q(`sum by (stream, consumer) (kiln_nats_consumer_ack_pending_messages${INGEST_STREAMS})`, '{{stream}} {{consumer}} ack pending'),
        ], { width: 8 }),
        timeseries('Store write latency', 'Duration of one batch write to the store, p50/p95/p99 by store (metrics|logs)', quantiles(
          'kiln_log_ingest_write_batch_duration_seconds_bucket', '', 'store',
        ), { unit: 's', width: 8 }),
        timeseries('Store errors', 'Failed batch writes per second, by store. Reads 0 (`or vector(0)`) while no write has failed yet: the series exists from the first failure on.', [
          q('sum by (store) (rate(kiln_log_ingest_store_errors_total[$__rate_interval])) or vector(0)', '{{store}}'),
        ], { unit: 'ops', width: 8 }),
      ],
    ],
  ],
});

export const nats = dashboard({
  uid: 'kiln-nats',
  title: 'kiln / NATS',
  description: 'JetStream consumer lag and stream sizes of every kiln stream, and nats-server /varz, as one kiln service reads them (scheduler by default; server stats need its `nats-monitor` URLs)',
  sections: [
    [
      'JetStream',
      [
        stat('JetStream up', '1 when the reporting service could read the streams and consumers', [q('min(kiln_nats_jetstream_up)', 'up')]),
        stat('Servers up', 'nats-servers whose /varz answered, of those configured in `nats-monitor`', [q('sum(kiln_nats_server_up)', 'up')]),
        stat('Pending messages', 'Messages of durable kiln consumers not yet delivered', [q(`sum(kiln_nats_consumer_pending_messages${DURABLE})`, 'pending')]),
        stat('Ack pending', 'Messages of durable kiln consumers delivered, not yet acknowledged', [q(`sum(kiln_nats_consumer_ack_pending_messages${DURABLE})`, 'ack pending')]),
        timeseries('Consumer pending', 'Messages not yet delivered, by stream and consumer kind', [
          q('sum by (stream, consumer) (kiln_nats_consumer_pending_messages)', '{{stream}} {{consumer}}'),
        ]),
        timeseries('Consumer ack pending', 'Messages delivered, not yet acknowledged, by stream and consumer kind', [
          q('sum by (stream, consumer) (kiln_nats_consumer_ack_pending_messages)', '{{stream}} {{consumer}}'),
        ]),
        timeseries('Stream messages', 'Messages held by each stream', [q('sum by (stream) (kiln_nats_stream_messages)', '{{stream}}')]),
        timeseries('Stream bytes', 'Bytes held by each stream', [q('sum by (stream) (kiln_nats_stream_bytes)', '{{stream}}')], { unit: 'bytes' }),
      ],
    ],
    [
      'Servers',
      [
        timeseries('Connections', 'Client connections, by server', [q('sum by (server) (kiln_nats_server_connections)', '{{server}}')], { width: 8 }),
        timeseries('Subscriptions', 'Subscriptions, by server', [q('sum by (server) (kiln_nats_server_subscriptions)', '{{server}}')], { width: 8 }),
        timeseries('CPU', 'CPU of each nats-server process (1 = one core)', [q('sum by (server) (kiln_nats_server_cpu_ratio)', '{{server}}')], { unit: 'percentunit', width: 8 }),
        timeseries('Memory', 'Resident memory and JetStream memory store, by server', [
          q('sum by (server) (kiln_nats_server_memory_bytes)', '{{server}} resident'),
          q('sum by (server) (kiln_nats_server_jetstream_memory_bytes)', '{{server}} jetstream memory'),
        ], { unit: 'bytes', width: 8 }),
        timeseries('JetStream storage', 'Bytes of the JetStream file store, by server', [
          q('sum by (server) (kiln_nats_server_jetstream_storage_bytes)', '{{server}}'),
        ], { unit: 'bytes', width: 8 }),
        timeseries('Slow consumers', 'Clients the server cut off or flagged as slow, per second', [
          q('sum by (server) (rate(kiln_nats_server_slow_consumers_total[$__rate_interval]))', '{{server}}'),
        ], { unit: 'ops', width: 8 }),
        timeseries('Messages', 'Messages in and out per second, by server', [
          q('sum by (server) (rate(kiln_nats_server_in_messages_total[$__rate_interval]))', '{{server}} in'),
          q('sum by (server) (rate(kiln_nats_server_out_messages_total[$__rate_interval]))', '{{server}} out'),
        ], { unit: 'ops', width: 8 }),
        timeseries('Bytes', 'Bytes in and out per second, by server', [
          q('sum by (server) (rate(kiln_nats_server_in_bytes_total[$__rate_interval]))', '{{server}} in'),
          q('sum by (server) (rate(kiln_nats_server_out_bytes_total[$__rate_interval]))', '{{server}} out'),
        ], { unit: 'Bps', width: 8 }),
        timeseries('JetStream API', 'JetStream API requests and errors per second, by server', [
          q('sum by (server) (rate(kiln_nats_server_jetstream_api_requests_total[$__rate_interval]))', '{{server}} requests'),
          q('sum by (server) (rate(kiln_nats_server_jetstream_api_errors_total[$__rate_interval]))', '{{server}} errors'),
        ], { unit: 'reqps', width: 8 }),
      ],
    ],
  ],
});

export const batches = dashboard({
  uid: 'kiln-batches',
  title: 'kiln / Batches',
  description: 'item-batch: items per second, item counters, backlog, workers requested and live, dead letters',
  sections: [
    [
      'Items',
      [
        stat('Items per second', 'Items finished over the last ~5 s', [q('sum(kiln_item_batch_items_per_second)', 'items/s')], { unit: 'short' }),
        stat('Dead letters in range', 'Items that used up their attempts in the time range', [
          q('sum(increase(kiln_item_batch_items_dead_total[$__range]))', 'dead'),
        ]),
        stat('Workers live / requested', 'Worker jobs running against those the scaler asked for', [
          q('sum(kiln_item_batch_workers_live)', 'live'),
          q('sum(kiln_item_batch_workers_requested)', 'requested'),
        ]),
        stat('Scaler leader', 'item-batch replicas holding the scaler lead: 1 is healthy', [q('sum(kiln_item_batch_scaler_leader)', 'leaders')]),
        timeseries('Item counters', 'Items added, dispatched, succeeded, failed (attempts, retried or not) and dead, per second', [
          q('sum(rate(kiln_item_batch_items_added_total[$__rate_interval]))', 'added'),
          q('sum(rate(kiln_item_batch_items_dispatched_total[$__rate_interval]))', 'dispatched'),
          q('sum(rate(kiln_item_batch_items_succeeded_total[$__rate_interval]))', 'succeeded'),
          q('sum(rate(kiln_item_batch_items_failed_total[$__rate_interval]))', 'failed'),
          q('sum(rate(kiln_item_batch_items_dead_total[$__rate_interval]))', 'dead'),
        ], { unit: 'ops' }),
        timeseries('Items finished per second', 'Items finished over the last ~5 s, as item-batch measures it', [
          q('sum(kiln_item_batch_items_per_second)', 'items/s'),
        ]),
      ],
    ],
    [
      'Backlog and workers',
      [
        timeseries('Backlog by state', 'Items of open batches, by state (pending|leased|succeeded|failed|dead)', [
          q('sum by (state) (kiln_item_batch_backlog_items)', '{{state}}'),
        ], { stack: true, width: 8 }),
        timeseries('Batches by state', 'Batches, by state', [q('sum by (state) (kiln_item_batch_batches)', '{{state}}')], { stack: true, width: 8 }),
        timeseries('Workers', 'Worker jobs the scaler asked for and those running', [
          q('sum(kiln_item_batch_workers_requested)', 'requested'),
          q('sum(kiln_item_batch_workers_live)', 'live'),
        ], { width: 8 }),
        timeseries('Dead letters', 'Items dead-lettered per interval', [
          q('sum(increase(kiln_item_batch_items_dead_total[$__rate_interval]))', 'dead'),
        ]),
        timeseries('Item queue lag', 'Messages on KILN_ITEMS not yet delivered to workers, and item results not yet read by item-batch', [
          q('sum by (stream, consumer) (kiln_nats_consumer_pending_messages{stream=~"KILN_ITEMS|KILN_ITEM_RESULTS"})', '{{stream}} {{consumer}}'),
        ]),
      ],
    ],
  ],
});
