/**
 * The JSON the sidebar reads, as the Python side writes it:
 * `GET <base_url>/workbench/api/servers` (workbench/jupyter/handlers.py) lists servers with the model
 * descriptions of `GET /workbench/v1/models` (workbench/models/manager.py, `describe`), and each server's
 * `GET /workbench/v1/stats` (workbench/observability/stats.py, `snapshot`) is polled through the proxy.
 */

/** A version's state: TF Serving's ModelVersionStatus.State names, plus NOT_LOADED for one only on disk. */
export type VersionState = 'START' | 'LOADING' | 'AVAILABLE' | 'UNLOADING' | 'END' | 'NOT_LOADED';

export interface IVersionInfo {
  version: number;
  state: VersionState;
  /** Why the version failed to load, or '' */
  error: string;
  /** Canonical error code name, 'OK' when there is none. */
  error_code: string;
  labels: string[];
  /** Share of the model's default traffic (no version or label asked for), 0 to 1. */
  traffic_share: number;
  pinned: boolean;
  dropped: boolean;
  on_disk: boolean;
}

export interface IModelInfo {
  name: string;
  base_path: string;
  platform: string;
  default_version: number | null;
  stable: number | null;
  previous_stable: number | null;
  canary: { version: number; weight: number } | null;
  labels: Record<string, number>;
  /** Newest first. */
  versions: IVersionInfo[];
  /** Only for a model routed by a registry (MLflow's aliases): the registered model and the version each alias names. */
  registry?: IRegistryInfo;
}

/** `"registry": {"uri": "models:/iris", "aliases": {"champion": 1, "challenger": 2}}`; an alias not set is absent. */
export interface IRegistryInfo {
  uri: string;
  aliases: Record<string, number>;
}

export interface IServerInfo {
  id: string;
  pid: number;
  name: string;
  rest_host: string;
  rest_port: number | null;
  grpc_host: string;
  grpc_port: number | null;
  model_repository: string;
  model_config_file: string;
  model_base_path: string;
  /** Epoch seconds. */
  started: number;
  /** workbench's version. */
  version: string;
  /** Whether the server's management POSTs need its bearer token. */
  token_required: boolean;
  /** `<base_url>workbench/proxy/<id>/`, or null when the server cannot be proxied. */
  proxy_url: string | null;
  /** Missing when `error` says why. */
  models?: IModelInfo[];
  error?: string;
}

export interface IServerListing {
  servers: IServerInfo[];
}

/** Rolling-window statistics of one model version (or of requests no version was resolved for, key ''). */
export interface IStatsEntry {
  requests_per_second: number;
  errors_per_second: number;
  p50_ms: number | null;
  p95_ms: number | null;
  p99_ms: number | null;
  mean_batch_size: number | null;
  batches_per_second: number;
  queue_depth: number;
  total_requests: number;
  total_errors: number;
  /** The response cache's lookups since the server started: only for a version with the cache on. */
  cache_hits?: number;
  cache_misses?: number;
  /** cache_hits over all lookups, 0 to 1. */
  cache_hit_rate?: number;
}

export interface IStatsSnapshot {
  /** Epoch seconds. */
  time: number;
  window_seconds: number;
  /** model name → version (as a string, '' for unresolved) → entry */
  models: Record<string, Record<string, IStatsEntry>>;
}
