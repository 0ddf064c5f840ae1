/**
 * The sidebar's model → view logic, free of JupyterLab and the DOM so that jest tests it directly:
 * statistics history per model, the rows the panel draws, which actions each row allows, and what each action
 * sends to the server.
 */

import type { IModelInfo, IServerInfo, IServerListing, IStatsEntry, IStatsSnapshot, IVersionInfo } from './types';

/** Points kept per model: half a minute at the panel's one-second stats poll. */
export const HISTORY_POINTS = 30;

/** One model's traffic at one moment: the sum over its versions, and the worst version's p99. */
export interface IModelRate {
  rps: number;
  errorsPerSecond: number;
  /** The highest p99 of the versions that answered requests in the window; null when none did. */
  p99: number | null;
}

export interface IModelPoint extends IModelRate {
  /** Server time of the snapshot, epoch seconds. */
  time: number;
}

/** A model's current rate from its versions' entries (the '' entry counts requests no version took). */
export function modelRate(entries: Record<string, IStatsEntry> | undefined): IModelRate {
  let rps = 0;
  let errorsPerSecond = 0;
  let p99: number | null = null;
  for (const entry of Object.values(entries ?? {})) {
    rps += entry.requests_per_second;
    errorsPerSecond += entry.errors_per_second;
    if (entry.p99_ms !== null && (p99 === null || entry.p99_ms > p99)) {
      p99 = entry.p99_ms;
    }
  }
  return { rps, errorsPerSecond, p99 };
}

/** A model's response cache lookups since the server started, summed over its versions. */
export interface ICacheCounts {
  hits: number;
  misses: number;
}

/** The cache counts of a model's versions' entries; null when none has any (the cache is off for the model). */
export function cacheCounts(entries: Record<string, IStatsEntry> | undefined): ICacheCounts | null {
  // Counts, not the versions' rates: averaging those would weigh a version with few lookups as a busy one.
  let hits = 0;
  let misses = 0;
  for (const entry of Object.values(entries ?? {})) {
    hits += entry.cache_hits ?? 0;
    misses += entry.cache_misses ?? 0;
  }
  return hits + misses > 0 ? { hits, misses } : null;
}

/**
 * The last HISTORY_POINTS statistics snapshots of every server, kept as a series per model for the sparklines.
 */
export class StatsHistory {
  constructor(readonly capacity: number = HISTORY_POINTS) {}

  /** Add a server's snapshot; a snapshot no newer than the last one kept (a repeated answer) is ignored. */
  record(serverId: string, snapshot: IStatsSnapshot): void {
    const last = this._latest.get(serverId);
    if (last !== undefined && snapshot.time <= last.time) {
      return;
    }
    this._latest.set(serverId, snapshot);
    for (const [model, entries] of Object.entries(snapshot.models)) {
      const key = seriesKey(serverId, model);
      const series = this._series.get(key) ?? [];
      series.push({ time: snapshot.time, ...modelRate(entries) });
      if (series.length > this.capacity) {
        series.splice(0, series.length - this.capacity);
      }
      this._series.set(key, series);
    }
  }

  /** A model's points, oldest first (empty before its first request). */
  series(serverId: string, model: string): readonly IModelPoint[] {
    return this._series.get(seriesKey(serverId, model)) ?? [];
  }

  /** The latest statistics of one version, if it has any. */
  versionEntry(serverId: string, model: string, version: number): IStatsEntry | undefined {
    return this._latest.get(serverId)?.models[model]?.[String(version)];
  }

  /** The latest statistics of a model's versions, if it has any. */
  modelEntries(serverId: string, model: string): Record<string, IStatsEntry> | undefined {
    return this._latest.get(serverId)?.models[model];
  }

  /** Forget servers that are gone, so that a long session does not keep every server it ever saw. */
  retain(serverIds: Iterable<string>): void {
    const keep = new Set(serverIds);
    for (const serverId of [...this._latest.keys()]) {
      if (!keep.has(serverId)) {
        this._latest.delete(serverId);
      }
    }
    for (const key of [...this._series.keys()]) {
      if (!keep.has(key.slice(0, key.indexOf('\n')))) {
        this._series.delete(key);
      }
    }
  }

  private _latest = new Map<string, IStatsSnapshot>();
  private _series = new Map<string, IModelPoint[]>();
}

function seriesKey(serverId: string, model: string): string {
  return `${serverId}\n${model}`; // a newline is in neither a registry id nor a model name
}

// ------------------------------------------------------------------------------------------------ the view

/** How a version row is drawn. */
export type VersionStatus = 'serving' | 'loading' | 'unloading' | 'failed' | 'not-loaded' | 'ended';

export interface IVersionRow {
  version: number;
  status: VersionStatus;
  /** The state as the server names it, lower case, or the load error. */
  statusText: string;
  labels: string[];
  /** The registry's aliases naming the version, '@champion' (empty for a model no registry routes). */
  aliases: string[];
  /** '75%' of the default traffic, or '' when the version gets none. */
  traffic: string;
  isStable: boolean;
  isCanary: boolean;
  /** Requests/s the version answers now, null without statistics. */
  rps: number | null;
  canPromote: boolean;
  canLoad: boolean;
  canUnload: boolean;
  /** Why Unload is off, shown as its tooltip; '' when it is on. */
  unloadBlockedBy: string;
}

export interface IModelView {
  /** Unique in the panel: the server id and the model name. */
  key: string;
  serverId: string;
  name: string;
  platform: string;
  /** 'stable v2 · canary v3 at 10%', or how the default version is chosen without a stable one. */
  routing: string;
  /** The registered model whose aliases route this one, 'models:/iris', or null without a registry. */
  registry: string | null;
  /** The version a rollback returns to, or null when there is none. */
  rollbackTo: number | null;
  current: IModelRate | null;
  rpsSeries: number[];
  p99Series: Array<number | null>;
  /** The response cache's hits and misses from the latest statistics; null when the model is not cached. */
  cache: ICacheCounts | null;
  versions: IVersionRow[];
}

export interface IServerView {
  id: string;
  name: string;
  /** ['REST 127.0.0.1:8501', 'gRPC 127.0.0.1:8500'] */
  endpoints: string[];
  /** What the model repository or config is, for the tooltip. */
  source: string;
  error: string | null;
  proxyUrl: string | null;
  tokenRequired: boolean;
  models: IModelView[];
}

/** The panel's rows: servers (newest first) → models → versions, with traffic from the history. */
export function buildView(listing: IServerListing, history: StatsHistory): IServerView[] {
  const servers = [...listing.servers].sort((a, b) => b.started - a.started || a.id.localeCompare(b.id));
  return servers.map(server => serverView(server, history));
}

function serverView(server: IServerInfo, history: StatsHistory): IServerView {
  const endpoints: string[] = [];
  if (server.rest_port !== null) {
    endpoints.push(`REST ${hostPort(server.rest_host, server.rest_port)}`);
  }
  if (server.grpc_port !== null) {
    endpoints.push(`gRPC ${hostPort(server.grpc_host, server.grpc_port)}`);
  }
  const models = (server.models ?? []).map(model => modelView(server.id, model, history));
  return {
    id: server.id,
    name: server.name || server.id,
    endpoints,
    source: server.model_repository || server.model_config_file || server.model_base_path,
    error: server.error ?? null,
    proxyUrl: server.proxy_url,
    tokenRequired: server.token_required,
    models
  };
}

function hostPort(host: string, port: number): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]:${port}` : `${host}:${port}`;
}

function modelView(serverId: string, model: IModelInfo, history: StatsHistory): IModelView {
  const series = history.series(serverId, model.name);
  const available = model.versions.filter(v => v.state === 'AVAILABLE');
  return {
    key: `${serverId}/${model.name}`,
    serverId,
    name: model.name,
    platform: model.platform,
    routing: routingText(model),
    registry: model.registry?.uri ?? null,
    rollbackTo: model.previous_stable,
    current: series.length ? series[series.length - 1] : null,
    rpsSeries: series.map(point => point.rps),
    p99Series: series.map(point => point.p99),
    cache: cacheCounts(history.modelEntries(serverId, model.name)),
    versions: model.versions.map(version =>
      versionRow(model, version, available, history.versionEntry(serverId, model.name, version.version))
    )
  };
}

function routingText(model: IModelInfo): string {
  const parts: string[] = [];
  if (model.stable !== null) {
    parts.push(`stable v${model.stable}`);
    // The stable version is loading or failed: the server answers with its newest serving version meanwhile.
    if (model.default_version !== model.stable) {
      parts.push(model.default_version !== null ? `v${model.default_version} answers` : 'no version serving');
    }
  } else if (model.default_version !== null) {
    parts.push(`newest v${model.default_version}`);
  } else {
    parts.push('no version serving');
  }
  if (model.canary !== null) {
    parts.push(`canary v${model.canary.version} at ${percent(model.canary.weight)}`);
  }
  return parts.join(' · ');
}

function versionRow(
  model: IModelInfo,
  version: IVersionInfo,
  available: IVersionInfo[],
  stats: IStatsEntry | undefined
): IVersionRow {
  const status = versionStatus(version);
  const isStable = model.stable === version.version;
  const isCanary = model.canary?.version === version.version;
  let unloadBlockedBy = '';
  if (version.state !== 'AVAILABLE') {
    unloadBlockedBy = 'not loaded';
  } else if (isStable) {
    unloadBlockedBy = 'the stable version: promote another first';
  } else if (isCanary) {
    unloadBlockedBy = 'the canary: end the canary first';
  } else if (available.length < 2) {
    unloadBlockedBy = 'the only version serving: load another first';
  }
  return {
    version: version.version,
    status,
    statusText: status === 'failed' ? `failed: ${version.error}` : version.state.toLowerCase().replace('_', ' '),
    labels: version.labels,
    aliases: aliasesOf(model, version.version),
    traffic: version.traffic_share > 0 ? percent(version.traffic_share) : '',
    isStable,
    isCanary,
    rps: stats ? stats.requests_per_second : null,
    // Promoting a version that is on disk loads it first; a version that failed to load is not promoted.
    canPromote: !isStable && (status === 'serving' || (status !== 'failed' && version.on_disk)),
    canLoad: version.on_disk && (status === 'not-loaded' || status === 'ended'),
    canUnload: unloadBlockedBy === '',
    unloadBlockedBy
  };
}

/** The aliases naming `version`, sorted, as MLflow writes them in a URI (models:/iris@champion). */
function aliasesOf(model: IModelInfo, version: number): string[] {
  const aliases = Object.entries(model.registry?.aliases ?? {});
  return aliases
    .filter(([, named]) => named === version)
    .map(([alias]) => `@${alias}`)
    .sort();
}

function versionStatus(version: IVersionInfo): VersionStatus {
  switch (version.state) {
    case 'AVAILABLE':
      return 'serving';
    case 'START':
    case 'LOADING':
      return 'loading';
    case 'UNLOADING':
      return 'unloading';
    case 'NOT_LOADED':
      return 'not-loaded';
    default:
      return version.error_code !== 'OK' ? 'failed' : 'ended';
  }
}

// ------------------------------------------------------------------------------------------------ actions

export type ActionKind = 'promote' | 'rollback' | 'load' | 'unload';

/** A management request, ready for the proxy, and how to ask the user before sending it. */
export interface IAction {
  kind: ActionKind;
  /** Below the server's proxy URL: 'workbench/v1/models/<model>:promote' */
  path: string;
  body: Record<string, unknown>;
  /** The confirmation dialog's title and text, and its accept button; needsConfirmation false: sent at once. */
  title: string;
  message: string;
  accept: string;
  needsConfirmation: boolean;
}

/** What an action on a model (or one of its versions) sends, and the question asked first. */
export function describeAction(kind: ActionKind, model: IModelView, version?: number): IAction {
  const name = encodeURIComponent(model.name);
  const modelPath = `workbench/v1/models/${name}`;
  const stable = model.versions.find(v => v.isStable)?.version;
  switch (kind) {
    case 'promote':
      return {
        kind,
        path: `${modelPath}:promote`,
        body: { version: requireVersion(kind, version) },
        title: `Promote ${model.name} v${version}?`,
        message:
          `Version ${version} becomes the stable version of ${model.name} and answers its default traffic` +
          (stable !== undefined ? ` in place of version ${stable}.` : '.') +
          (model.versions.find(v => v.version === version)?.status === 'serving' ? '' : ' It is loaded first.'),
        accept: 'Promote',
        needsConfirmation: true
      };
    case 'rollback':
      if (model.rollbackTo === null) {
        throw new Error(`${model.name} has no previous stable version to roll back to`);
      }
      return {
        kind,
        path: `${modelPath}:rollback`,
        body: {},
        title: `Roll back ${model.name}?`,
        message:
          `Version ${model.rollbackTo} becomes the stable version of ${model.name} again` +
          (stable !== undefined ? ` in place of version ${stable}.` : '.'),
        accept: 'Roll back',
        needsConfirmation: true
      };
    case 'unload':
      return {
        kind,
        path: `${modelPath}/versions/${requireVersion(kind, version)}:unload`,
        body: {},
        title: `Unload ${model.name} v${version}?`,
        message:
          `Version ${version} of ${model.name} stops serving and frees its memory; requests naming it get an ` +
          'error. Load it again from this panel while it is on disk.',
        accept: 'Unload',
        needsConfirmation: true
      };
    case 'load':
      return {
        kind,
        path: `${modelPath}/versions/${requireVersion(kind, version)}:load`,
        body: {},
        title: `Load ${model.name} v${version}`,
        message: `Version ${version} of ${model.name} is loaded and kept loaded.`,
        accept: 'Load',
        needsConfirmation: false
      };
  }
}

function requireVersion(kind: ActionKind, version: number | undefined): number {
  if (version === undefined) {
    throw new Error(`${kind} needs a version`);
  }
  return version;
}

/** The message of a failed management request: TF Serving's `{"error": ...}` body, or the HTTP status. */
export function errorMessage(status: number, body: string): string {
  try {
    const doc = JSON.parse(body) as unknown;
    const error = doc !== null && typeof doc === 'object' ? (doc as { error?: unknown }).error : undefined;
    if (typeof error === 'string' && error) {
      return error;
    }
  } catch {
    // not JSON: fall through to the status
  }
  return `HTTP ${status}${body ? `: ${body.slice(0, 200)}` : ''}`;
}

// ------------------------------------------------------------------------------------------------ formatting

export function percent(share: number): string {
  const value = Math.round(share * 1000) / 10; // one decimal, without floating-point noise (0.07 → 7)
  return `${value >= 10 || Number.isInteger(value) ? Math.round(value) : value.toFixed(1)}%`;
}

/** 'cache 87% hits': the share of a model's lookups the response cache answered. */
export function formatCache(cache: ICacheCounts): string {
  return `cache ${percent(cache.hits / (cache.hits + cache.misses))} hits`;
}

/** '0', '8.5', '120', '1.2k' requests per second. */
export function formatRate(rps: number): string {
  // Each format is chosen by the value as it will be rounded, so that 99.96 shows as 100, not 100.0.
  if (rps === 0) {
    return '0';
  }
  if (Math.round(rps * 10) < 1000) {
    return rps.toFixed(1);
  }
  if (Math.round(rps) < 1000) {
    return rps.toFixed(0);
  }
  return `${(rps / 1000).toFixed(Math.round(rps / 100) < 100 ? 1 : 0)}k`;
}

/** '—' without requests, '0.62 ms', '23 ms', '1.4 s'. */
export function formatMs(ms: number | null): string {
  if (ms === null) {
    return '—';
  }
  if (Math.round(ms * 100) < 1000) {
    return `${ms.toFixed(2)} ms`;
  }
  if (Math.round(ms) < 1000) {
    return `${Math.round(ms)} ms`;
  }
  return `${(ms / 1000).toFixed(1)} s`;
}

/**
 * An SVG path through `values`, newest at the right edge, scaled from 0 to the largest value (or `ceiling` if
 * larger); a null leaves a gap. `slots` fixes the spacing so that the line grows in from the right.
 */
export function sparklinePath(
  values: ReadonlyArray<number | null>,
  width: number,
  height: number,
  slots: number = HISTORY_POINTS,
  ceiling = 0
): string {
  const top = Math.max(ceiling, ...values.map(value => value ?? 0));
  const step = width / Math.max(slots - 1, 1);
  const commands: string[] = [];
  let drawing = false;
  values.forEach((value, i) => {
    if (value === null) {
      drawing = false;
      return;
    }
    const x = width - (values.length - 1 - i) * step;
    // A flat zero line sits on the bottom edge; a stroke of 1px stays visible there.
    const y = top > 0 ? height - (value / top) * (height - 1) - 0.5 : height - 0.5;
    commands.push(`${drawing ? 'L' : 'M'}${round(x)} ${round(y)}`);
    drawing = true;
  });
  return commands.join(' ');
}

function round(value: number): number {
  return Math.round(value * 10) / 10;
}
