import {
  buildView,
  cacheCounts,
  describeAction,
  errorMessage,
  formatCache,
  formatMs,
  formatRate,
  HISTORY_POINTS,
  modelRate,
  percent,
  sparklinePath,
  StatsHistory,
  type IModelView,
  type IServerView,
  type IVersionRow
} from '../model';
import type { IModelInfo, IServerInfo, IServerListing } from '../types';
import {
  entry,
  FRAUD,
  fraud,
  iris,
  listing,
  localServer,
  mnist,
  mnistSnapshot,
  NEWER_START,
  OLDER_START,
  resnet,
  snapshot,
  version,
  yolo
} from './fixtures';

const LOCAL = '41873-8501';
const IPV6 = '52210-9001';

function view(servers: IServerInfo[] = listing().servers, history = new StatsHistory()): IServerView[] {
  return buildView({ servers }, history);
}

function modelOf(servers: IServerView[], name: string): IModelView {
  const model = servers.flatMap(server => server.models).find(m => m.name === name);
  if (!model) {
    throw new Error(`no model ${name} in the view`);
  }
  return model;
}

/** The view of one model on an otherwise plain local server. */
function viewModel(model: IModelInfo, history = new StatsHistory()): IModelView {
  return modelOf(view([{ ...localServer(), models: [model] }], history), model.name);
}

function rowOf(model: IModelView, versionNumber: number): IVersionRow {
  const row = model.versions.find(r => r.version === versionNumber);
  if (!row) {
    throw new Error(`no version ${versionNumber} of ${model.name}`);
  }
  return row;
}

// ------------------------------------------------------------------------------------------------ modelRate

describe('modelRate', () => {
  it('is zero, with no p99, without entries', () => {
    expect(modelRate(undefined)).toEqual({ rps: 0, errorsPerSecond: 0, p99: null });
    expect(modelRate({})).toEqual({ rps: 0, errorsPerSecond: 0, p99: null });
  });

  it("sums requests and errors over the versions, the unresolved '' entry included", () => {
    const rate = modelRate(mnistSnapshot(100).models.mnist);
    expect(rate.rps).toBeCloseTo(45 + 5 + 0.5, 10);
    expect(rate.errorsPerSecond).toBeCloseTo(0 + 0.5 + 0.5, 10);
  });

  it('takes the worst p99 of the versions that have one', () => {
    expect(modelRate(mnistSnapshot(100).models.mnist).p99).toBe(12.5);
    expect(modelRate({ '1': entry({ p99_ms: 40 }), '2': entry({ p99_ms: null }), '3': entry({ p99_ms: 7 }) }).p99).toBe(
      40
    );
  });

  it('ignores null p99s but keeps a p99 of 0', () => {
    expect(modelRate({ '1': entry({ p99_ms: null }), '': entry({ p99_ms: null }) }).p99).toBeNull();
    expect(modelRate({ '1': entry({ p99_ms: null }), '2': entry({ p99_ms: 0 }) }).p99).toBe(0);
    expect(modelRate({ '2': entry({ p99_ms: 0 }), '1': entry({ p99_ms: null }) }).p99).toBe(0);
  });
});

describe('cacheCounts', () => {
  it('is null without entries, and for entries without cache fields (the cache is off for the model)', () => {
    expect(cacheCounts(undefined)).toBeNull();
    expect(cacheCounts({})).toBeNull();
    expect(cacheCounts(mnistSnapshot(100).models.mnist)).toBeNull();
  });

  it("sums hits and misses over the versions that have them, not the versions' rates", () => {
    const entries = {
      '1': entry({ cache_hits: 1, cache_misses: 9, cache_hit_rate: 0.1 }),
      '2': entry({ cache_hits: 86, cache_misses: 4, cache_hit_rate: 0.9556 }),
      '': entry({ total_errors: 2 }) // requests no version took: never looked up
    };
    expect(cacheCounts(entries)).toEqual({ hits: 87, misses: 13 });
  });
});

// ------------------------------------------------------------------------------------------------ StatsHistory

describe('StatsHistory', () => {
  it('keeps half a minute of one-second points by default', () => {
    expect(HISTORY_POINTS).toBe(30);
    expect(new StatsHistory().capacity).toBe(HISTORY_POINTS);
  });

  it('has no series before the first snapshot', () => {
    const history = new StatsHistory();
    expect(history.series(LOCAL, 'mnist')).toEqual([]);
    expect(history.versionEntry(LOCAL, 'mnist', 2)).toBeUndefined();
  });

  it('records one point per snapshot and model, oldest first, with the server time', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, mnistSnapshot(1001, 2));
    const series = history.series(LOCAL, 'mnist');
    expect(series.map(point => point.time)).toEqual([1000, 1001]);
    expect(series[0].rps).toBeCloseTo(50.5, 10);
    expect(series[1].rps).toBeCloseTo(100.5, 10);
    expect(series.map(point => point.errorsPerSecond)).toEqual([1, 1]);
    expect(series.map(point => point.p99)).toEqual([12.5, 25]);
  });

  it('keeps one series per model of a snapshot', () => {
    const history = new StatsHistory();
    history.record(
      LOCAL,
      snapshot(1000, {
        mnist: { '2': entry({ requests_per_second: 3, p99_ms: 4 }) },
        resnet: { '7': entry({ requests_per_second: 8, p99_ms: 30 }) }
      })
    );
    expect(history.series(LOCAL, 'mnist')).toEqual([{ time: 1000, rps: 3, errorsPerSecond: 0, p99: 4 }]);
    expect(history.series(LOCAL, 'resnet')).toEqual([{ time: 1000, rps: 8, errorsPerSecond: 0, p99: 30 }]);
    expect(history.series(LOCAL, 'yolo')).toEqual([]);
  });

  it('adds no point to a model missing from a snapshot', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, snapshot(1001, { resnet: { '7': entry() } }));
    expect(history.series(LOCAL, 'mnist').map(point => point.time)).toEqual([1000]);
    expect(history.series(LOCAL, 'resnet').map(point => point.time)).toEqual([1001]);
  });

  it('ignores a repeated snapshot (same time) and an older one', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, mnistSnapshot(1000, 3)); // the same answer polled twice
    history.record(LOCAL, mnistSnapshot(999.5, 5)); // a late answer to an earlier poll
    const series = history.series(LOCAL, 'mnist');
    expect(series).toHaveLength(1);
    expect(series[0].time).toBe(1000);
    expect(series[0].rps).toBeCloseTo(50.5, 10);
    // The version figures stay those of the snapshot kept.
    expect(history.versionEntry(LOCAL, 'mnist', 2)?.requests_per_second).toBe(45);
    history.record(LOCAL, mnistSnapshot(1000.001, 2));
    expect(history.series(LOCAL, 'mnist')).toHaveLength(2);
    expect(history.versionEntry(LOCAL, 'mnist', 2)?.requests_per_second).toBe(90);
  });

  it('orders snapshots per server: the same time on two servers is recorded for both', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(IPV6, mnistSnapshot(1000, 2));
    history.record(IPV6, mnistSnapshot(990)); // older than IPV6's last, though newer than nothing on LOCAL
    expect(history.series(LOCAL, 'mnist').map(point => point.rps)).toEqual([50.5]);
    expect(history.series(IPV6, 'mnist').map(point => point.rps)).toEqual([100.5]);
  });

  it('trims each series to its capacity, dropping the oldest points', () => {
    const history = new StatsHistory(3);
    for (let t = 1; t <= 5; t++) {
      history.record(LOCAL, snapshot(t, { mnist: { '2': entry({ requests_per_second: t * 10 }) } }));
    }
    expect(history.series(LOCAL, 'mnist').map(point => point.time)).toEqual([3, 4, 5]);
    expect(history.series(LOCAL, 'mnist').map(point => point.rps)).toEqual([30, 40, 50]);
  });

  it('keeps HISTORY_POINTS points by default', () => {
    const history = new StatsHistory();
    for (let t = 0; t < HISTORY_POINTS + 5; t++) {
      history.record(LOCAL, snapshot(1000 + t, { mnist: { '2': entry({ requests_per_second: t }) } }));
    }
    const series = history.series(LOCAL, 'mnist');
    expect(series).toHaveLength(HISTORY_POINTS);
    expect(series[0].time).toBe(1005);
    expect(series[series.length - 1].time).toBe(1000 + HISTORY_POINTS + 4);
  });

  it("gives a version's entry from the latest snapshot", () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, mnistSnapshot(1001, 2));
    const latest = mnistSnapshot(1001, 2).models.mnist;
    expect(history.versionEntry(LOCAL, 'mnist', 2)).toEqual(latest['2']);
    expect(history.versionEntry(LOCAL, 'mnist', 3)).toEqual(latest['3']);
    expect(history.versionEntry(LOCAL, 'mnist', 1)).toBeUndefined(); // no requests
    expect(history.versionEntry(LOCAL, 'resnet', 7)).toBeUndefined(); // no such model
    expect(history.versionEntry(IPV6, 'mnist', 2)).toBeUndefined(); // no such server
  });

  it('retain() forgets the servers that are gone and keeps the others', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(IPV6, mnistSnapshot(1000));
    history.record(IPV6, snapshot(1001, { resnet: { '7': entry({ requests_per_second: 1 }) } }));
    history.retain([LOCAL]);
    expect(history.series(LOCAL, 'mnist')).toHaveLength(1);
    expect(history.versionEntry(LOCAL, 'mnist', 2)).toBeDefined();
    expect(history.series(IPV6, 'mnist')).toEqual([]);
    expect(history.series(IPV6, 'resnet')).toEqual([]);
    expect(history.versionEntry(IPV6, 'resnet', 7)).toBeUndefined();
  });

  it('retain() matches whole server ids, not prefixes', () => {
    const history = new StatsHistory();
    history.record('41873-85', mnistSnapshot(1000));
    history.record('41873-8501', mnistSnapshot(1000));
    history.retain(['41873-85']);
    expect(history.series('41873-85', 'mnist')).toHaveLength(1);
    expect(history.series('41873-8501', 'mnist')).toEqual([]);
  });

  it('retain() takes any iterable, and an empty one forgets everything', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.retain(new Set([LOCAL]).values());
    expect(history.series(LOCAL, 'mnist')).toHaveLength(1);
    history.retain([]);
    expect(history.series(LOCAL, 'mnist')).toEqual([]);
    expect(history.versionEntry(LOCAL, 'mnist', 2)).toBeUndefined();
  });

  it('records a forgotten server anew, whatever the time of its last snapshot', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.retain([]);
    history.record(LOCAL, mnistSnapshot(500));
    expect(history.series(LOCAL, 'mnist').map(point => point.time)).toEqual([500]);
  });
});

// ------------------------------------------------------------------------------------------------ buildView: servers

describe('buildView: servers', () => {
  it('lists the servers newest first', () => {
    const servers = view();
    expect(servers.map(server => server.id)).toEqual([IPV6, LOCAL]);
    expect(NEWER_START).toBeGreaterThan(OLDER_START);
  });

  it('orders servers started at the same moment by id, and does not reorder the listing it was given', () => {
    const a = { ...localServer(), id: 'b-2', started: 5 };
    const b = { ...localServer(), id: 'a-1', started: 5 };
    const c = { ...localServer(), id: 'c-3', started: 9 };
    const given: IServerListing = { servers: [a, b, c] };
    expect(buildView(given, new StatsHistory()).map(server => server.id)).toEqual(['c-3', 'a-1', 'b-2']);
    expect(given.servers.map(server => server.id)).toEqual(['b-2', 'a-1', 'c-3']);
  });

  it('is empty for an empty listing', () => {
    expect(buildView({ servers: [] }, new StatsHistory())).toEqual([]);
  });

  it("describes a server that answered: endpoints, source, proxy, no error, its models in the server's order", () => {
    const server = view().find(s => s.id === LOCAL)!;
    expect(server).toMatchObject({
      id: LOCAL,
      name: 'workbench-models',
      endpoints: ['REST 127.0.0.1:8501', 'gRPC 127.0.0.1:8500'],
      source: '/home/ada/workbench-models',
      error: null,
      proxyUrl: '/user/ada/workbench/proxy/41873-8501/',
      tokenRequired: false
    });
    expect(server.models.map(model => model.name)).toEqual([FRAUD, 'mnist', 'resnet', 'yolo']);
    expect(server.models.map(model => model.key)).toEqual([
      `${LOCAL}/${FRAUD}`,
      `${LOCAL}/mnist`,
      `${LOCAL}/resnet`,
      `${LOCAL}/yolo`
    ]);
    expect(server.models.every(model => model.serverId === LOCAL)).toBe(true);
  });

  it('describes a server whose model list failed: its error, no models, IPv6 endpoints in brackets', () => {
    const server = view().find(s => s.id === IPV6)!;
    expect(server).toEqual({
      id: IPV6,
      name: 'models.config',
      endpoints: ['REST [::1]:9001', 'gRPC [::]:9000'],
      source: '/etc/workbench/models.config',
      error: 'answered HTTP 500',
      proxyUrl: '/user/ada/workbench/proxy/52210-9001/',
      tokenRequired: true,
      models: []
    });
  });

  it('brackets full IPv6 addresses and leaves host names and IPv4 as they are', () => {
    const server = {
      ...localServer(),
      rest_host: '0:0:0:0:0:0:0:1',
      grpc_host: 'localhost'
    };
    expect(view([server])[0].endpoints).toEqual(['REST [0:0:0:0:0:0:0:1]:8501', 'gRPC localhost:8500']);
    expect(view([{ ...localServer(), rest_host: '0.0.0.0' }])[0].endpoints).toEqual(['REST 0.0.0.0:8501', 'gRPC 127.0.0.1:8500']);
  });

  it('leaves out an endpoint whose port is off', () => {
    const restOff: IServerInfo = {
      ...localServer(),
      rest_port: null,
      proxy_url: null,
      models: undefined,
      error: 'REST API is off: nothing to list or proxy'
    };
    const [server] = view([restOff]);
    expect(server.endpoints).toEqual(['gRPC 127.0.0.1:8500']);
    expect(server.proxyUrl).toBeNull();
    expect(server.error).toBe('REST API is off: nothing to list or proxy');
    expect(server.models).toEqual([]);
    expect(view([{ ...localServer(), grpc_port: null }])[0].endpoints).toEqual(['REST 127.0.0.1:8501']);
    expect(view([{ ...localServer(), rest_port: null, grpc_port: null }])[0].endpoints).toEqual([]);
  });

  it('names a server by its id when it has no name', () => {
    expect(view([{ ...localServer(), name: '' }])[0].name).toBe(LOCAL);
  });

  it('takes the source from the repository, else the config file, else the base path', () => {
    const none = { model_repository: '', model_config_file: '', model_base_path: '' };
    expect(view([{ ...localServer(), ...none, model_base_path: '/m/half_plus_two' }])[0].source).toBe(
      '/m/half_plus_two'
    );
    expect(view([{ ...localServer(), ...none, model_config_file: '/etc/m.config', model_base_path: '/m/x' }])[0].source).toBe(
      '/etc/m.config'
    );
    expect(view([{ ...localServer(), ...none }])[0].source).toBe('');
  });

  it('reads the JSON the server extension sends, extra keys included', () => {
    // Keys the front end does not use (process_start from the registry, policy from describe) are passed through.
    const body = JSON.stringify({
      servers: [
        {
          ...localServer(),
          process_start: 123456789,
          models: [{ ...mnist(), policy: { latest: { num_versions: 1 } } }]
        }
      ]
    });
    const [server] = buildView(JSON.parse(body) as IServerListing, new StatsHistory());
    expect(server.models[0].routing).toBe('stable v2 · canary v3 at 10%');
    expect(server.models[0].versions.map(row => row.version)).toEqual([4, 3, 2, 1]);
  });
});

// ------------------------------------------------------------------------------------------------ buildView: models

describe('buildView: models', () => {
  it('describes routing: the stable version and the canary with its share', () => {
    expect(modelOf(view(), 'mnist').routing).toBe('stable v2 · canary v3 at 10%');
    expect(modelOf(view(), FRAUD).routing).toBe('stable v5');
  });

  it('says which version answers while the stable one does not serve (loading, or failed to load)', () => {
    const loading = { ...mnist(), default_version: 3 };
    expect(viewModel(loading).routing).toBe('stable v2 · v3 answers · canary v3 at 10%');
    const none = { ...mnist(), default_version: null };
    expect(viewModel(none).routing).toBe('stable v2 · no version serving · canary v3 at 10%');
  });

  it('describes routing without a stable version: the newest, or that no version serves', () => {
    expect(modelOf(view(), 'resnet').routing).toBe('newest v7');
    expect(modelOf(view(), 'yolo').routing).toBe('no version serving');
  });

  it('describes a canary without a stable version', () => {
    const model: IModelInfo = { ...resnet(), canary: { version: 6, weight: 0.25 } };
    expect(viewModel(model).routing).toBe('newest v7 · canary v6 at 25%');
    const idle: IModelInfo = { ...yolo(), canary: { version: 1, weight: 0.05 } };
    expect(viewModel(idle).routing).toBe('no version serving · canary v1 at 5%');
  });

  it('gives the rollback target, or null without one', () => {
    expect(modelOf(view(), FRAUD).rollbackTo).toBe(4);
    expect(modelOf(view(), 'mnist').rollbackTo).toBeNull();
    expect(modelOf(view(), 'resnet').rollbackTo).toBeNull();
  });

  it('passes the platform through', () => {
    expect(viewModel({ ...resnet(), platform: 'onnx' }).platform).toBe('onnx');
  });

  it('has no current rate and empty series before statistics', () => {
    const model = modelOf(view(), 'mnist');
    expect(model.current).toBeNull();
    expect(model.rpsSeries).toEqual([]);
    expect(model.p99Series).toEqual([]);
    expect(model.versions.map(row => row.rps)).toEqual([null, null, null, null]);
  });

  it("takes the series and current rate from the history of the model's own server", () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, snapshot(1001, { mnist: { '2': entry({ requests_per_second: 0 }) } })); // quiet second
    history.record(LOCAL, mnistSnapshot(1002, 2));
    history.record(IPV6, mnistSnapshot(1003, 10)); // another server's mnist
    const model = modelOf(view(listing().servers, history), 'mnist');
    expect(model.rpsSeries).toHaveLength(3);
    expect(model.rpsSeries[0]).toBeCloseTo(50.5, 10);
    expect(model.rpsSeries[1]).toBe(0);
    expect(model.rpsSeries[2]).toBeCloseTo(100.5, 10);
    expect(model.p99Series).toEqual([12.5, null, 25]);
    expect(model.current).toMatchObject({ time: 1002, errorsPerSecond: 1, p99: 25 });
    expect(model.current!.rps).toBeCloseTo(100.5, 10);
  });

  it("gives each version row the requests/s of the latest snapshot, null for a version without an entry", () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, mnistSnapshot(1001, 2));
    const model = modelOf(view(listing().servers, history), 'mnist');
    expect(model.versions.map(row => [row.version, row.rps])).toEqual([
      [4, null],
      [3, 10],
      [2, 90],
      [1, null]
    ]);
  });

  it("shows the response cache's counts of the latest snapshot, only for a model whose versions have them", () => {
    const history = new StatsHistory();
    history.record(LOCAL, snapshot(1000, { mnist: { '2': entry({ cache_hits: 1, cache_misses: 3 }) } }));
    const latest = mnistSnapshot(1001);
    latest.models.mnist['2'] = { ...latest.models.mnist['2'], cache_hits: 61, cache_misses: 9, cache_hit_rate: 0.8714 };
    latest.models.mnist['3'] = { ...latest.models.mnist['3'], cache_hits: 26, cache_misses: 4, cache_hit_rate: 0.8667 };
    history.record(LOCAL, { ...latest, models: { ...latest.models, resnet: { '7': entry() } } });
    const servers = view(listing().servers, history);
    const mnistView = modelOf(servers, 'mnist');
    expect(mnistView.cache).toEqual({ hits: 87, misses: 13 });
    expect(formatCache(mnistView.cache!)).toBe('cache 87% hits');
    expect(modelOf(servers, 'resnet').cache).toBeNull(); // stats, but no cache
    expect(modelOf(servers, FRAUD).cache).toBeNull(); // no stats at all
    expect(modelOf(view(), 'mnist').cache).toBeNull(); // before any statistics
  });

  it('keeps rows in the order the server sends them (newest first)', () => {
    expect(modelOf(view(), 'mnist').versions.map(row => row.version)).toEqual([4, 3, 2, 1]);
  });
});

// ------------------------------------------------------------------------------------------------ version rows

describe('buildView: version rows', () => {
  const model = () => modelOf(view(), 'mnist');

  it('gives each state its status and status text', () => {
    expect(model().versions.map(row => [row.version, row.status, row.statusText])).toEqual([
      [4, 'failed', 'failed: Could not find a SavedModel (saved_model.pb) in /home/ada/workbench-models/mnist/4'],
      [3, 'serving', 'available'],
      [2, 'serving', 'available'],
      [1, 'not-loaded', 'not loaded']
    ]);
  });

  it('maps every TF Serving state', () => {
    const states: IModelInfo = {
      ...resnet(),
      versions: [
        version({ version: 16, state: 'START' }),
        version({ version: 15, state: 'LOADING' }),
        version({ version: 14, state: 'UNLOADING' }),
        version({ version: 13, state: 'END' }),
        version({ version: 12, state: 'END', error: 'out of memory', error_code: 'RESOURCE_EXHAUSTED' }),
        version({ version: 11, state: 'NOT_LOADED' }),
        version({ version: 10, state: 'AVAILABLE' })
      ]
    };
    expect(viewModel(states).versions.map(row => [row.status, row.statusText])).toEqual([
      ['loading', 'start'],
      ['loading', 'loading'],
      ['unloading', 'unloading'],
      ['ended', 'end'],
      ['failed', 'failed: out of memory'],
      ['not-loaded', 'not loaded'],
      ['serving', 'available']
    ]);
  });

  it("shows each version's share of the default traffic, blank for none", () => {
    expect(model().versions.map(row => row.traffic)).toEqual(['', '10%', '90%', '']);
    expect(modelOf(view(), 'resnet').versions.map(row => row.traffic)).toEqual(['100%', '']);
  });

  it('passes the labels through and flags the stable version and the canary', () => {
    expect(model().versions.map(row => [row.version, row.labels, row.isStable, row.isCanary])).toEqual([
      [4, [], false, false],
      [3, ['canary'], false, true],
      [2, ['stable'], true, false],
      [1, [], false, false]
    ]);
    const labelled: IModelInfo = {
      ...fraud(),
      labels: { stable: 5, champion: 5, shadow: 4 },
      versions: [
        version({ version: 5, state: 'AVAILABLE', labels: ['champion', 'stable'], traffic_share: 1 }),
        version({ version: 4, state: 'AVAILABLE', labels: ['shadow'] })
      ]
    };
    expect(viewModel(labelled).versions.map(row => row.labels)).toEqual([['champion', 'stable'], ['shadow']]);
  });

  it('flags no version stable or canary on a model without a stable version or canary', () => {
    const rows = modelOf(view(), 'resnet').versions;
    expect(rows.some(row => row.isStable || row.isCanary)).toBe(false);
  });

  it('offers Promote for a serving or on-disk version that is not stable and did not fail', () => {
    expect(model().versions.map(row => [row.version, row.canPromote])).toEqual([
      [4, false], // failed to load
      [3, true], // the canary graduates
      [2, false], // already stable
      [1, true] // on disk: loaded first
    ]);
    expect(rowOf(modelOf(view(), 'resnet'), 7).canPromote).toBe(true); // newest, never promoted
    expect(rowOf(modelOf(view(), 'resnet'), 6).canPromote).toBe(true); // unloaded, still on disk
    expect(rowOf(modelOf(view(), 'yolo'), 1).canPromote).toBe(true); // loading, on disk
  });

  it('offers no Promote for a version neither serving nor on disk', () => {
    const gone: IModelInfo = {
      ...resnet(),
      versions: [version({ version: 7, state: 'AVAILABLE', traffic_share: 1 }), version({ version: 6, state: 'END', on_disk: false })]
    };
    expect(rowOf(viewModel(gone), 6).canPromote).toBe(false);
    expect(rowOf(viewModel(gone), 6).canLoad).toBe(false);
  });

  it('offers Load for an on-disk version that is not loaded or ended, and for nothing else', () => {
    expect(model().versions.map(row => [row.version, row.canLoad])).toEqual([
      [4, false], // failed: loading it again fails again until its files change
      [3, false],
      [2, false],
      [1, true]
    ]);
    expect(rowOf(modelOf(view(), 'resnet'), 6).canLoad).toBe(true); // unloaded by hand, on disk
    expect(rowOf(modelOf(view(), 'yolo'), 1).canLoad).toBe(false); // already loading
  });

  it('blocks Unload of the stable version', () => {
    const row = rowOf(model(), 2);
    expect(row.canUnload).toBe(false);
    expect(row.unloadBlockedBy).toBe('the stable version: promote another first');
  });

  it('blocks Unload of the canary', () => {
    const row = rowOf(model(), 3);
    expect(row.canUnload).toBe(false);
    expect(row.unloadBlockedBy).toBe('the canary: end the canary first');
  });

  it('blocks Unload of the only serving version', () => {
    const row = rowOf(modelOf(view(), 'resnet'), 7);
    expect(row.canUnload).toBe(false);
    expect(row.unloadBlockedBy).toBe('the only version serving: load another first');
  });

  it('blocks Unload of a version that is not loaded', () => {
    for (const [name, v] of [
      ['mnist', 1],
      ['mnist', 4],
      ['resnet', 6],
      ['yolo', 1]
    ] as const) {
      const row = rowOf(modelOf(view(), name), v);
      expect([name, v, row.canUnload, row.unloadBlockedBy]).toEqual([name, v, false, 'not loaded']);
    }
  });

  it('allows Unload of a serving version with no role while another serves', () => {
    const row = rowOf(modelOf(view(), FRAUD), 4); // the rollback target: unloading it drops the target
    expect(row.canUnload).toBe(true);
    expect(row.unloadBlockedBy).toBe('');
  });

  it('counts only AVAILABLE versions as serving when blocking Unload', () => {
    const model: IModelInfo = {
      ...resnet(),
      versions: [
        version({ version: 8, state: 'LOADING' }),
        version({ version: 7, state: 'AVAILABLE', traffic_share: 1 }),
        version({ version: 6, state: 'UNLOADING' })
      ]
    };
    expect(rowOf(viewModel(model), 7).unloadBlockedBy).toBe('the only version serving: load another first');
    const two: IModelInfo = {
      ...model,
      versions: [...model.versions, version({ version: 5, state: 'AVAILABLE' })]
    };
    expect(rowOf(viewModel(two), 7).canUnload).toBe(true);
    expect(rowOf(viewModel(two), 5).canUnload).toBe(true);
  });

  it('names the stable role first when the stable version is also the only one serving', () => {
    const solo: IModelInfo = {
      ...fraud(),
      previous_stable: null,
      versions: [version({ version: 5, state: 'AVAILABLE', labels: ['stable'], traffic_share: 1 })]
    };
    expect(rowOf(viewModel(solo), 5).unloadBlockedBy).toBe('the stable version: promote another first');
  });
});

describe('buildView: a model routed by a registry', () => {
  it('names the registered model', () => {
    expect(viewModel(iris()).registry).toBe('models:/iris');
  });

  it('has no registry for a model routed by its own stored routing', () => {
    expect(modelOf(view(), 'mnist').registry).toBeNull();
    expect(modelOf(view(), 'mnist').versions.every(row => row.aliases.length === 0)).toBe(true);
  });

  it('marks each version with the aliases naming it, beside its roles', () => {
    expect(viewModel(iris()).versions.map(row => [row.version, row.labels, row.aliases])).toEqual([
      [3, [], []],
      [2, ['canary'], ['@challenger']],
      [1, ['stable'], ['@champion']]
    ]);
  });

  it('marks a version named by two aliases with both, sorted', () => {
    const model: IModelInfo = {
      ...iris(),
      registry: { uri: 'models:/iris', aliases: { production: 3, champion: 3, challenger: 2 } }
    };
    expect(rowOf(viewModel(model), 3).aliases).toEqual(['@champion', '@production']);
  });

  it('keeps the registered model with no alias set, and marks no version', () => {
    const model: IModelInfo = { ...iris(), registry: { uri: 'models:/iris', aliases: {} } };
    expect(viewModel(model).registry).toBe('models:/iris');
    expect(viewModel(model).versions.map(row => row.aliases)).toEqual([[], [], []]);
  });

  it('marks no row for an alias naming a version the server does not list', () => {
    const model: IModelInfo = { ...iris(), registry: { uri: 'models:/iris', aliases: { champion: 9 } } };
    expect(viewModel(model).versions.flatMap(row => row.aliases)).toEqual([]);
  });
});

// ------------------------------------------------------------------------------------------------ actions

describe('describeAction', () => {
  const mnistView = () => modelOf(view(), 'mnist');
  const fraudView = () => modelOf(view(), FRAUD);
  const resnetView = () => modelOf(view(), 'resnet');
  // The management routes of workbench/frontends/management.py.
  const MODEL_ACTION = /^workbench\/v1\/models\/([^/:]+):(promote|rollback|canary)$/;
  const VERSION_ACTION = /^workbench\/v1\/models\/([^/:]+)\/versions\/(\d+):(load|unload)$/;

  it('promotes a serving version in place of the stable one', () => {
    expect(describeAction('promote', mnistView(), 3)).toEqual({
      kind: 'promote',
      path: 'workbench/v1/models/mnist:promote',
      body: { version: 3 },
      title: 'Promote mnist v3?',
      message: 'Version 3 becomes the stable version of mnist and answers its default traffic in place of version 2.',
      accept: 'Promote',
      needsConfirmation: true
    });
  });

  it('says that a version only on disk is loaded first', () => {
    const action = describeAction('promote', mnistView(), 1);
    expect(action.body).toEqual({ version: 1 });
    expect(action.message).toBe(
      'Version 1 becomes the stable version of mnist and answers its default traffic in place of version 2. ' +
        'It is loaded first.'
    );
  });

  it('promotes without naming a stable version when the model has none', () => {
    const action = describeAction('promote', resnetView(), 7);
    expect(action.message).toBe('Version 7 becomes the stable version of resnet and answers its default traffic.');
    expect(describeAction('promote', resnetView(), 6).message).toBe(
      'Version 6 becomes the stable version of resnet and answers its default traffic. It is loaded first.'
    );
  });

  it('rolls back to the previous stable version, URL-encoding the model name in the path only', () => {
    const action = describeAction('rollback', fraudView());
    expect(action).toEqual({
      kind: 'rollback',
      path: 'workbench/v1/models/fraud%20detector%20%232:rollback',
      body: {},
      title: 'Roll back fraud detector #2?',
      message: 'Version 4 becomes the stable version of fraud detector #2 again in place of version 5.',
      accept: 'Roll back',
      needsConfirmation: true
    });
    expect(decodeURIComponent(MODEL_ACTION.exec(action.path)![1])).toBe(FRAUD);
  });

  it('ignores a version given to rollback', () => {
    expect(describeAction('rollback', fraudView(), 5)).toEqual(describeAction('rollback', fraudView()));
  });

  it('rolls back without naming a stable version when none is listed', () => {
    const model: IModelInfo = { ...resnet(), previous_stable: 6 };
    expect(describeAction('rollback', viewModel(model)).message).toBe(
      'Version 6 becomes the stable version of resnet again.'
    );
  });

  it('refuses a rollback without a target', () => {
    expect(() => describeAction('rollback', mnistView())).toThrow('mnist has no previous stable version to roll back to');
  });

  it('asks before unloading, with a warning about requests naming the version', () => {
    const action = describeAction('unload', fraudView(), 4);
    expect(action).toMatchObject({
      kind: 'unload',
      path: 'workbench/v1/models/fraud%20detector%20%232/versions/4:unload',
      body: {},
      title: 'Unload fraud detector #2 v4?',
      accept: 'Unload',
      needsConfirmation: true
    });
    expect(action.message).toContain('Version 4 of fraud detector #2 stops serving');
    expect(action.message).toContain('requests naming it get an error');
    expect(VERSION_ACTION.exec(action.path)!.slice(2)).toEqual(['4', 'unload']);
  });

  it('loads without asking', () => {
    const action = describeAction('load', mnistView(), 1);
    expect(action).toEqual({
      kind: 'load',
      path: 'workbench/v1/models/mnist/versions/1:load',
      body: {},
      title: 'Load mnist v1',
      message: 'Version 1 of mnist is loaded and kept loaded.',
      accept: 'Load',
      needsConfirmation: false
    });
  });

  it('produces paths the management routes accept', () => {
    const model = fraudView();
    expect(describeAction('promote', model, 4).path).toMatch(MODEL_ACTION);
    expect(describeAction('rollback', model).path).toMatch(MODEL_ACTION);
    expect(describeAction('load', model, 4).path).toMatch(VERSION_ACTION);
    expect(describeAction('unload', model, 4).path).toMatch(VERSION_ACTION);
    // Characters that would end or split the path segment are encoded.
    const odd = viewModel({ ...resnet(), name: 'a?b&c=d%e' });
    expect(describeAction('promote', odd, 7).path).toBe('workbench/v1/models/a%3Fb%26c%3Dd%25e:promote');
  });

  it.each(['promote', 'load', 'unload'] as const)('refuses %s without a version', kind => {
    expect(() => describeAction(kind, mnistView())).toThrow(`${kind} needs a version`);
  });

  it('accepts version 0', () => {
    expect(describeAction('promote', mnistView(), 0).body).toEqual({ version: 0 });
    expect(describeAction('load', mnistView(), 0).path).toBe('workbench/v1/models/mnist/versions/0:load');
  });
});

// ------------------------------------------------------------------------------------------------ errorMessage

describe('errorMessage', () => {
  it("gives TF Serving's {error} message", () => {
    expect(
      errorMessage(
        400,
        '{"error": "Version 2 of model mnist is its stable version: promote another or end the canary first"}'
      )
    ).toBe('Version 2 of model mnist is its stable version: promote another or end the canary first');
    expect(errorMessage(504, JSON.stringify({ error: 'workbench server 41873-8501 did not answer in time' }))).toBe(
      'workbench server 41873-8501 did not answer in time'
    );
  });

  it('falls back to the status and the body when the body is not JSON', () => {
    expect(errorMessage(502, '<html><body>Bad Gateway</body></html>')).toBe(
      'HTTP 502: <html><body>Bad Gateway</body></html>'
    );
  });

  it('falls back to the status and the body for JSON without a string error', () => {
    expect(errorMessage(500, '{"error": {"code": 13}}')).toBe('HTTP 500: {"error": {"code": 13}}');
    expect(errorMessage(500, 'null')).toBe('HTTP 500: null');
    expect(errorMessage(500, '"oops"')).toBe('HTTP 500: "oops"');
    expect(errorMessage(500, '[]')).toBe('HTTP 500: []');
  });

  it('gives the status alone for an empty body', () => {
    expect(errorMessage(401, '')).toBe('HTTP 401');
  });

  it('cuts a long body at 200 characters', () => {
    const body = 'x'.repeat(500);
    expect(errorMessage(500, body)).toBe(`HTTP 500: ${'x'.repeat(200)}`);
  });
});

// ------------------------------------------------------------------------------------------------ formatting

describe('percent', () => {
  it('gives whole percentages from 10% up and for whole values', () => {
    expect(percent(0)).toBe('0%');
    expect(percent(0.05)).toBe('5%');
    expect(percent(0.1)).toBe('10%');
    expect(percent(0.25)).toBe('25%');
    expect(percent(0.9)).toBe('90%');
    expect(percent(1)).toBe('100%');
    expect(percent(1 / 3)).toBe('33%');
    expect(percent(0.333333)).toBe('33%'); // describe rounds shares to 6 decimals
    expect(percent(0.125)).toBe('13%');
    expect(percent(0.29)).toBe('29%'); // 28.999999999999996
  });

  it('gives one decimal below 10%', () => {
    expect(percent(0.075)).toBe('7.5%');
    expect(percent(0.005)).toBe('0.5%');
    expect(percent(0.035)).toBe('3.5%'); // 3.5000000000000004
    expect(percent(0.0333)).toBe('3.3%');
  });

  // FAILS with model.ts as it is: 0.07 * 100 is 7.000000000000001 in floating point, which is not an integer,
  // so it is drawn as '7.0%' while 5% is '5%'; a share just under 10% rounds up to '10.0%'.
  it('gives whole percentages for shares that are whole up to floating-point noise', () => {
    expect(percent(0.07)).toBe('7%');
    expect(percent(0.0996)).toBe('10%');
    const model: IModelInfo = { ...mnist(), canary: { version: 3, weight: 0.07 } };
    expect(viewModel(model).routing).toBe('stable v2 · canary v3 at 7%');
  });
});

describe('formatCache', () => {
  it("gives the share of lookups answered from the cache, as percent() draws shares", () => {
    expect(formatCache({ hits: 87, misses: 13 })).toBe('cache 87% hits');
    expect(formatCache({ hits: 0, misses: 5 })).toBe('cache 0% hits');
    expect(formatCache({ hits: 5, misses: 0 })).toBe('cache 100% hits');
    expect(formatCache({ hits: 3, misses: 37 })).toBe('cache 7.5% hits');
  });
});

describe('formatRate', () => {
  it('gives 0 for no requests and one decimal below 100', () => {
    expect(formatRate(0)).toBe('0');
    expect(formatRate(0.1)).toBe('0.1');
    expect(formatRate(8.5)).toBe('8.5');
    expect(formatRate(50.5)).toBe('50.5');
    expect(formatRate(99.9)).toBe('99.9');
    expect(formatRate(99.94)).toBe('99.9');
  });

  it('gives whole numbers from 100 to 999', () => {
    expect(formatRate(100)).toBe('100');
    expect(formatRate(120)).toBe('120');
    expect(formatRate(120.4)).toBe('120');
    expect(formatRate(999.4)).toBe('999');
  });

  it('gives thousands with one decimal below 10k, whole above', () => {
    expect(formatRate(1000)).toBe('1.0k');
    expect(formatRate(1234)).toBe('1.2k');
    expect(formatRate(9949)).toBe('9.9k');
    expect(formatRate(10000)).toBe('10k');
    expect(formatRate(15500)).toBe('16k');
    expect(formatRate(123456)).toBe('123k');
  });

  // FAILS with model.ts as it is: the format is chosen before rounding, so a rate just under a boundary rounds up
  // into the next range drawn the previous range's way: '100.0', '1000', '10.0k'.
  it('rounds a rate just under a boundary into the next range, drawn that range’s way', () => {
    expect(formatRate(99.96)).toBe('100');
    expect(formatRate(999.6)).toBe('1.0k');
    expect(formatRate(9960)).toBe('10k');
  });
});

describe('formatMs', () => {
  it('gives a dash without requests', () => {
    expect(formatMs(null)).toBe('—');
  });

  it('gives two decimals below 10 ms, whole milliseconds to 999 ms, seconds with one decimal above', () => {
    expect(formatMs(0)).toBe('0.00 ms');
    expect(formatMs(0.62)).toBe('0.62 ms');
    expect(formatMs(6.25)).toBe('6.25 ms');
    expect(formatMs(9.99)).toBe('9.99 ms');
    expect(formatMs(10)).toBe('10 ms');
    expect(formatMs(23.4)).toBe('23 ms');
    expect(formatMs(999.4)).toBe('999 ms');
    expect(formatMs(1000)).toBe('1.0 s');
    expect(formatMs(1449)).toBe('1.4 s');
    expect(formatMs(1460)).toBe('1.5 s');
    expect(formatMs(61234)).toBe('61.2 s');
  });

  // FAILS with model.ts as it is: 9.996 is drawn '10.00 ms' and 999.6 '1000 ms'.
  it('rounds a latency just under a boundary into the next range, drawn that range’s way', () => {
    expect(formatMs(9.996)).toBe('10 ms');
    expect(formatMs(999.6)).toBe('1.0 s');
  });
});

// ------------------------------------------------------------------------------------------------ sparklinePath

/** The points of a path, as [command, x, y]. */
function points(path: string): Array<[string, number, number]> {
  const found = [...path.matchAll(/([ML])(-?[\d.]+) (-?[\d.]+)/g)].map(
    m => [m[1], Number(m[2]), Number(m[3])] as [string, number, number]
  );
  // Nothing in the path but these points.
  expect(found.map(([c, x, y]) => `${c}${x} ${y}`).join(' ')).toBe(path);
  return found;
}

describe('sparklinePath', () => {
  it('is empty without values, and with nothing but gaps', () => {
    expect(sparklinePath([], 72, 18)).toBe('');
    expect(sparklinePath([null, null], 72, 18)).toBe('');
  });

  it('draws all zeros as a flat line on the bottom edge', () => {
    const drawn = points(sparklinePath([0, 0, 0, 0], 72, 18));
    expect(drawn).toHaveLength(4);
    expect(drawn.map(([, , y]) => y)).toEqual([17.5, 17.5, 17.5, 17.5]);
    expect(drawn.map(([c]) => c)).toEqual(['M', 'L', 'L', 'L']);
  });

  it('puts the newest point on the right edge and spaces points by the slots', () => {
    const drawn = points(sparklinePath([1, 2, 3], 72, 18));
    expect(drawn[drawn.length - 1][1]).toBe(72);
    const step = 72 / (HISTORY_POINTS - 1);
    expect(drawn.map(([, x]) => x)).toEqual([Math.round((72 - 2 * step) * 10) / 10, Math.round((72 - step) * 10) / 10, 72]);
  });

  it('spans the whole width when every slot is filled', () => {
    const values = Array.from({ length: HISTORY_POINTS }, (_, i) => i);
    const drawn = points(sparklinePath(values, 72, 18));
    expect(drawn).toHaveLength(HISTORY_POINTS);
    expect(drawn[0][1]).toBe(0);
    expect(drawn[HISTORY_POINTS - 1][1]).toBe(72);
    expect(drawn.slice(1).every(([c]) => c === 'L')).toBe(true);
  });

  it('scales from 0 on the bottom to the largest value on the top, inside a 1px stroke', () => {
    expect(sparklinePath([0, 5, 10], 10, 10, 3)).toBe('M0 9.5 L5 5 L10 0.5');
    expect(sparklinePath([20, 10], 10, 10, 2)).toBe('M0 0.5 L10 5');
  });

  it('scales to the ceiling when it is above every value', () => {
    expect(sparklinePath([5], 10, 10, 3, 10)).toBe('M10 5');
    expect(sparklinePath([0, 5, 10], 10, 10, 3, 4)).toBe('M0 9.5 L5 5 L10 0.5'); // a lower ceiling is ignored
  });

  it('starts a new segment after a gap', () => {
    expect(sparklinePath([1, null, 2, 2], 30, 10, 4)).toBe('M0 5 M20 0.5 L30 0.5');
    expect(sparklinePath([null, null, 3], 30, 10, 4)).toBe('M30 0.5');
    expect(sparklinePath([4, null], 30, 10, 4)).toBe('M20 0.5');
    const drawn = points(sparklinePath([3, 3, null, null, 3, null, 3], 60, 10, 7));
    expect(drawn.map(([c]) => c)).toEqual(['M', 'L', 'M', 'M']);
  });

  it('treats gaps as 0 when scaling', () => {
    expect(sparklinePath([null, 2], 10, 10, 2)).toBe('M10 0.5');
  });

  it('draws one slot on the right edge', () => {
    expect(sparklinePath([7], 72, 18, 1)).toBe('M72 0.5');
  });

  it('draws the p99 series of a model with quiet seconds as separate segments', () => {
    const history = new StatsHistory();
    history.record(LOCAL, mnistSnapshot(1000));
    history.record(LOCAL, snapshot(1001, { mnist: { '2': entry() } }));
    history.record(LOCAL, mnistSnapshot(1002, 2));
    const model = modelOf(view(listing().servers, history), 'mnist');
    const drawn = points(sparklinePath(model.p99Series, 72, 18));
    expect(drawn.map(([c]) => c)).toEqual(['M', 'M']);
    expect(drawn[1]).toEqual(['M', 72, 0.5]);
    const rps = points(sparklinePath(model.rpsSeries, 72, 18));
    expect(rps.map(([c]) => c)).toEqual(['M', 'L', 'L']);
    expect(rps[1][2]).toBe(17.5); // the quiet second on the bottom
  });
});
