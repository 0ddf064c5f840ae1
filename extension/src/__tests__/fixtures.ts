/**
 * Fixtures shaped like what the Python side sends: `GET workbench/api/servers` (workbench/jupyter/handlers.py:
 * a registry record, `proxy_url`, and the models of `Manager.describe` or an `error`) and `GET /workbench/v1/stats`
 * (`RollingStats.snapshot`). Each call returns fresh objects, so a test may change its copy.
 */

import type { IModelInfo, IServerInfo, IServerListing, IStatsEntry, IStatsSnapshot, IVersionInfo } from '../types';

/** Epoch seconds (time.time()) the fixtures' servers started at. */
export const OLDER_START = 1717400000.125;
export const NEWER_START = 1717400900.5;

/** A version as `describe` writes it, with the defaults of a loaded version that has no role. */
export function version(fields: Partial<IVersionInfo> & Pick<IVersionInfo, 'version' | 'state'>): IVersionInfo {
  return {
    error: '',
    error_code: 'OK',
    labels: [],
    traffic_share: 0,
    pinned: false,
    dropped: false,
    on_disk: true,
    ...fields
  };
}

/**
 * mnist: v4 failed to load (END, NOT_FOUND), v3 the 10% canary, v2 stable with 90%, v1 only on disk.
 * The server labels the canary 'canary' and the stable 'stable' (routing labels on top of the config's).
 */
export function mnist(): IModelInfo {
  return {
    name: 'mnist',
    base_path: '/home/ada/workbench-models/mnist',
    platform: 'tensorflow',
    default_version: 2,
    stable: 2,
    previous_stable: null,
    canary: { version: 3, weight: 0.1 },
    labels: { canary: 3, stable: 2 },
    versions: [
      version({
        version: 4,
        state: 'END',
        error: 'Could not find a SavedModel (saved_model.pb) in /home/ada/workbench-models/mnist/4',
        error_code: 'NOT_FOUND'
      }),
      version({ version: 3, state: 'AVAILABLE', labels: ['canary'], traffic_share: 0.1 }),
      version({ version: 2, state: 'AVAILABLE', labels: ['stable'], traffic_share: 0.9 }),
      version({ version: 1, state: 'NOT_LOADED' })
    ]
  };
}

/** A model name that needs URL-encoding; v5 stable after a promotion from v4, which stays loaded for rollback. */
export const FRAUD = 'fraud detector #2';

export function fraud(): IModelInfo {
  return {
    name: FRAUD,
    base_path: '/srv/models/fraud',
    platform: 'tensorflow',
    default_version: 5,
    stable: 5,
    previous_stable: 4,
    canary: null,
    labels: { stable: 5 },
    versions: [
      version({ version: 5, state: 'AVAILABLE', labels: ['stable'], traffic_share: 1 }),
      version({ version: 4, state: 'AVAILABLE' })
    ]
  };
}

/** No promotion (stable null): TF Serving's default, the newest available version; v6 was unloaded by hand. */
export function resnet(): IModelInfo {
  return {
    name: 'resnet',
    base_path: '/home/ada/workbench-models/resnet',
    platform: 'tensorflow',
    default_version: 7,
    stable: null,
    previous_stable: null,
    canary: null,
    labels: {},
    versions: [
      version({ version: 7, state: 'AVAILABLE', traffic_share: 1 }),
      version({ version: 6, state: 'END', dropped: true })
    ]
  };
}

/** Nothing serves yet: its only version is loading. */
export function yolo(): IModelInfo {
  return {
    name: 'yolo',
    base_path: '/home/ada/workbench-models/yolo',
    platform: 'tensorflow',
    default_version: null,
    stable: null,
    previous_stable: null,
    canary: null,
    labels: {},
    versions: [version({ version: 1, state: 'LOADING' })]
  };
}

/**
 * Routed by MLflow's registry (`--model_base_path models:/iris`): champion (the stable) names v1, challenger (the
 * canary) v2; v3 is registered with no alias. The server's labels are the roles, the aliases come in `registry`.
 */
export function iris(): IModelInfo {
  return {
    name: 'iris',
    base_path: 'models:/iris',
    platform: 'mlflow',
    default_version: 1,
    stable: 1,
    previous_stable: null,
    canary: { version: 2, weight: 0.25 },
    labels: { canary: 2, stable: 1 },
    versions: [
      version({ version: 3, state: 'AVAILABLE' }),
      version({ version: 2, state: 'AVAILABLE', labels: ['canary'], traffic_share: 0.25 }),
      version({ version: 1, state: 'AVAILABLE', labels: ['stable'], traffic_share: 0.75 })
    ],
    registry: { uri: 'models:/iris', aliases: { champion: 1, challenger: 2 } }
  };
}

/** The older server: answers, four models (describe sorts them by name). */
export function localServer(): IServerInfo {
  return {
    id: '41873-8501',
    pid: 41873,
    name: 'workbench-models',
    rest_host: '127.0.0.1',
    rest_port: 8501,
    grpc_host: '127.0.0.1',
    grpc_port: 8500,
    model_repository: '/home/ada/workbench-models',
    model_config_file: '',
    model_base_path: '',
    started: OLDER_START,
    version: '0.1.0',
    token_required: false,
    proxy_url: '/user/ada/workbench/proxy/41873-8501/',
    models: [fraud(), mnist(), resnet(), yolo()]
  };
}

/** The newer server: on IPv6 loopback, with a management token, and its model list failed (no `models`). */
export function ipv6Server(): IServerInfo {
  return {
    id: '52210-9001',
    pid: 52210,
    name: 'models.config',
    rest_host: '::1',
    rest_port: 9001,
    grpc_host: '::',
    grpc_port: 9000,
    model_repository: '',
    model_config_file: '/etc/workbench/models.config',
    model_base_path: '',
    started: NEWER_START,
    version: '0.1.0',
    token_required: true,
    proxy_url: '/user/ada/workbench/proxy/52210-9001/',
    error: 'answered HTTP 500'
  };
}

/** The listing as the server extension sends it: the registry's order, which is not newest first. */
export function listing(): IServerListing {
  return { servers: [localServer(), ipv6Server()] };
}

/** A stats entry as `RollingStats.snapshot` writes it, for a version that answered nothing in the window. */
export function entry(fields: Partial<IStatsEntry> = {}): IStatsEntry {
  return {
    requests_per_second: 0,
    errors_per_second: 0,
    p50_ms: null,
    p95_ms: null,
    p99_ms: null,
    mean_batch_size: null,
    batches_per_second: 0,
    queue_depth: 0,
    total_requests: 0,
    total_errors: 0,
    ...fields
  };
}

export function snapshot(time: number, models: IStatsSnapshot['models']): IStatsSnapshot {
  return { time, window_seconds: 10, models };
}

/** mnist's traffic at `time`: the stable, the canary, and requests no version was resolved for ('' key). */
export function mnistSnapshot(time: number, scale = 1): IStatsSnapshot {
  return snapshot(time, {
    mnist: {
      '2': entry({
        requests_per_second: 45 * scale,
        errors_per_second: 0,
        p50_ms: 1.8,
        p95_ms: 3.9,
        p99_ms: 6.25 * scale,
        mean_batch_size: 4.5,
        batches_per_second: 10,
        total_requests: 1200
      }),
      '3': entry({
        requests_per_second: 5 * scale,
        errors_per_second: 0.5,
        p50_ms: 2.2,
        p95_ms: 7.5,
        p99_ms: 12.5 * scale,
        mean_batch_size: 1,
        batches_per_second: 5,
        total_requests: 130,
        total_errors: 3
      }),
      '': entry({ requests_per_second: 0.5, errors_per_second: 0.5, total_requests: 4, total_errors: 4 })
    }
  });
}
