// The messages of proto/kiln/v1/*.proto as the HTTP gateway sends them (proto3 JSON mapping,
// lowerCamelCase, int64 as numbers, enums by name, defaults included). Only the fields the UI
// reads are typed; the gateway may send more.

/** A double that may be non-finite: the gateway sends NaN and infinities as strings. */
export type JsonDouble = number | 'NaN' | 'Infinity' | '-Infinity';

export type JobStateName =
  | 'JOB_STATE_UNSPECIFIED' | 'JOB_STATE_QUEUED' | 'JOB_STATE_SCHEDULED'
  | 'JOB_STATE_PROVISIONING' | 'JOB_STATE_RUNNING' | 'JOB_STATE_SYNCING'
  | 'JOB_STATE_SUCCEEDED' | 'JOB_STATE_FAILED' | 'JOB_STATE_STOPPED'
  | 'JOB_STATE_PREEMPTED' | 'JOB_STATE_LOST';

export type RoleName = 'ROLE_UNSPECIFIED' | 'ROLE_VIEWER' | 'ROLE_MEMBER' | 'ROLE_MAINTAINER';

/** One value of a run's config (a oneof: exactly one field is set). */
export interface ConfigValue {
  boolValue?: boolean;
  intValue?: number;
  floatValue?: JsonDouble;
  stringValue?: string;
}

export interface JobSpec {
  name: string;
  command: string[];
  env: Record<string, string>;
  resources?: { cpuMillis: number; memoryBytes: number; diskBytes?: number; shmBytes?: number };
  codeDigest: string;
  project: string;
  image: string;
  gpus: number;
  maxRuntimeSecs: number;
  datasets: string[];
  priorityClass: string;
  market: string;
  pool: string;
  secrets: string[];
  /** Nodes of a gang job (0 and 1: one node). */
  nodes?: number;
}

export interface Job {
  id: string;
  spec?: JobSpec;
  state: JobStateName;
  version: number;
  exitCode?: number;
  reason: string;
  owner: string;
  pool: string;
  runnerId: string;
  instanceId: string;
  attempt: number;
  stopRequested: boolean;
  createdAtMs: number;
  startedAtMs: number;
  finishedAtMs: number;
  preemptions: number;
  market: string;
  cost: number;
  onDemandCost: number;
  config: Record<string, ConfigValue>;
  summary: Record<string, ConfigValue>;
  sweepId: string;
}

export interface Explanation {
  jobId: string;
  state: JobStateName;
  summary: string;
  jobsAhead: number;
  details: string[];
}

export interface MetricPoint {
  key: string;
  step: number;
  value: JsonDouble;
  timestampMs: number;
}

/** QueryMetrics' buckets with `"bands": true`: one entry per bucket in each column. */
export interface MetricBands {
  steps: number[];
  timestampsMs: number[];
  mins: JsonDouble[];
  maxs: JsonDouble[];
  lasts: JsonDouble[];
}

export interface MetricSeries {
  jobId: string;
  key: string;
  points: MetricPoint[];
  totalPoints: number;
  bands?: MetricBands;
}

export interface LogLine {
  attempt: number;
  seq: number;
  stream: 'LOG_STREAM_UNSPECIFIED' | 'LOG_STREAM_STDOUT' | 'LOG_STREAM_STDERR';
  timestampMs: number;
  text: string;
}

export interface Member { project: string; user: string; role: RoleName }

export interface WhoAmI {
  user: string;
  admin: boolean;
  tokenName: string;
  jobId: string;
  memberships: Member[];
  service: string;
  /** The caller's user id: what jobs carry as `owner`. */
  userId: string;
}

export interface BatchCounts {
  total: number; pending: number; running: number;
  succeeded: number; failed: number; dead: number;
}

export interface Batch {
  id: string;
  spec?: { name: string; project: string; command: string[]; maxWorkers: number; image: string };
  state: 'BATCH_STATE_UNSPECIFIED' | 'BATCH_STATE_OPEN' | 'BATCH_STATE_SEALED' | 'BATCH_STATE_DONE' | 'BATCH_STATE_CANCELLED';
  owner: string;
  counts?: BatchCounts;
  itemsPerSecond: number;
  etaSeconds: number;
  workers: number;
  cpuSecondsPerItem: number;
  peakMemoryBytes: number;
  createdAtMs: number;
  finishedAtMs: number;
  stalledReason: string;
  /** Why the batch was paused (its owner may no longer run jobs); absent or empty when not. */
  pausedReason?: string;
  /** What the items' last attempts used (GetBatch only). */
  usage?: BatchUsage;
}

export interface UsageSpread { p50?: number; p95?: number; max?: number }

export interface BatchUsage {
  items?: number;
  cpuCores?: UsageSpread;
  peakMemoryBytes?: UsageSpread;
  wallSeconds?: UsageSpread;
  sizingHint?: string;
}

export type ItemStateName = 'ITEM_STATE_UNSPECIFIED' | 'ITEM_STATE_PENDING' | 'ITEM_STATE_SUCCEEDED' | 'ITEM_STATE_FAILED' | 'ITEM_STATE_DEAD';

export interface ItemStatus {
  key: string;
  uri: string;
  state: ItemStateName;
  attempts: number;
  exitCode?: number;
  reason: string;
  updatedAtMs: number;
  /** The last attempt's own CPU seconds, peak memory and wall time. */
  cpuSeconds?: number;
  peakMemoryBytes?: number;
  durationMs?: number;
}

/** A kept output line of an item's attempt that BatchLogService/SearchBatchLogs matched. */
export interface ItemLogLine {
  key: string;
  attempt: number;
  /** Its place among its attempt's kept lines (1, 2, ...). */
  line: number;
  stream: LogLine['stream'];
  timestampMs: number;
  text: string;
  /** How the attempt ended. */
  state: ItemStateName;
}

export interface SearchBatchLogsResponse {
  lines: ItemLogLine[];
  /** More lines matched than the request's limit. */
  truncated: boolean;
}

export interface Trial {
  index: number;
  jobId: string;
  state: string;
  config: Record<string, ConfigValue>;
  value?: JsonDouble;
  resource: number;
  reason: string;
  preemptions: number;
}

export interface Sweep {
  id: string; name: string; project: string; owner: string; state: string; reason: string;
  specYaml: string; objectiveMetric: string; goal: string; algorithm: string; earlyStop: string;
  maxTrials: number; maxParallel: number; trials: Trial[];
  counts?: { suggested: number; running: number; succeeded: number; failed: number; stopped: number };
  gpuHours: number; createdAtMs: number; finishedAtMs: number; best?: Trial; registered: string;
  /** Why the sweep was paused (its owner may no longer run jobs); absent or empty when not. */
  pausedReason?: string;
}

export interface ServiceWorker { jobId: string; state: JobStateName }
export interface ServiceMember {
  member: string; modelVersion: string; weight: number; revision: number; wanted: number;
  workers: ServiceWorker[];
}
export interface Service {
  name: string; project: string; owner: string; state: string; reason: string;
  revision: number; latestRevision: number; members: ServiceMember[];
  /** Workers per member: min = max for a fixed number (ScaleService's `replicas`). */
  scaling?: { minReplicas: number; maxReplicas: number };
  createdAtMs: number; updatedAtMs: number; url: string; traffic: number; shadow: boolean;
  recent?: ServiceTraffic;
  /** Why the service was paused (its owner may no longer run jobs); absent or empty when not. */
  pausedReason?: string;
}
export interface ServiceTraffic {
  windowSeconds: number; requests: number; answered: number; partial: number; invalid: number; failed: number;
  p50Ms: number; p95Ms: number; p99Ms: number;
}

export interface Model {
  name: string; project: string; createdBy: string; createdAtMs: number;
  latestVersion: number; aliases: Record<string, number>;
}
export interface ModelVersion {
  model: string; project: string; version: number; digest: string; tags: Record<string, string>;
  aliases: string[]; createdBy: string; createdAtMs: number; description: string; size: number;
  lineage?: { jobId: string; sweepId: string; metrics: Record<string, JsonDouble> };
}

export interface Quota {
  scope: string; cpuMillis?: number; memoryBytes?: number; gpus?: number;
  runningJobs?: number; queuedJobs?: number; weight?: JsonDouble;
}
export interface User { id: string; name: string; admin: boolean; disabled: boolean; createdAtMs: number }
export interface Project { name: string; createdAtMs: number; role: RoleName }

export interface RunArtifactFile { name: string; path: string; digest: string; size: number }

/** A project's secret as reads show it: no RPC ever returns a value. */
export interface Secret { project: string; name: string; createdAtMs: number; updatedAtMs: number }
/** One of the caller's tokens (never the token itself, which only CreateToken returns, once). */
export interface Token {
  id: string; name: string; user: string; createdAtMs: number; lastUsedAtMs: number;
  expiresAtMs: number; revoked: boolean; project: string; role: RoleName;
}
export interface Dataset { name: string; digest: string; size: number; createdBy: string; createdAtMs: number; project: string }
