/**
 * The "Model serving" sidebar: every workbench server of this Jupyter session → models → versions, with live
 * traffic and the management actions. It polls the server extension, so it keeps working while kernels are busy.
 */

import { Dialog, InputDialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { ReactWidget, refreshIcon, addIcon } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import * as React from 'react';

import { WorkbenchAPI, WorkbenchRequestError } from './api';
import {
  buildView,
  describeAction,
  formatCache,
  formatMs,
  formatRate,
  HISTORY_POINTS,
  sparklinePath,
  StatsHistory,
  type ActionKind,
  type IModelView,
  type IServerView,
  type IVersionRow
} from './model';
import type { IServerListing } from './types';

/** How often the panel asks for the server list, and for each server's statistics, while it is shown. */
const LIST_INTERVAL_MS = 2000;
const STATS_INTERVAL_MS = 1000;

export interface IServingPanelOptions {
  api?: WorkbenchAPI;
  /** Runs "New Serving Notebook" from the panel's toolbar and empty state. */
  onNewNotebook: () => void;
}

export class ServingPanel extends ReactWidget {
  constructor(options: IServingPanelOptions) {
    super();
    this.id = 'workbench-serving';
    this.addClass('jp-WorkbenchPanel');
    this._api = options.api ?? new WorkbenchAPI();
    this._onNewNotebook = options.onNewNotebook;
    // Polls stand by while the panel (or the browser tab) is hidden, and back off while the server is unreachable.
    this._listPoll = new Poll({
      factory: () => this._refreshList(),
      frequency: { interval: LIST_INTERVAL_MS, backoff: true, max: 30_000 },
      standby: () => (this.isVisible ? 'when-hidden' : true),
      name: 'workbench:servers'
    });
    this._statsPoll = new Poll({
      factory: () => this._refreshStats(),
      frequency: { interval: STATS_INTERVAL_MS, backoff: false },
      standby: () => (this.isVisible ? 'when-hidden' : true),
      name: 'workbench:stats'
    });
  }

  /** Ask for the server list now (after an action, or from the refresh button). */
  async refresh(): Promise<void> {
    await this._listPoll.refresh();
    await this._listPoll.tick;
  }

  dispose(): void {
    this._listPoll.dispose();
    this._statsPoll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this._listPoll.refresh();
    void this._statsPoll.refresh();
  }

  protected render(): JSX.Element {
    const servers = this._listing ? buildView(this._listing, this._history) : null;
    return (
      <>
        <div className="jp-WorkbenchPanel-header">
          <h2>Model serving</h2>
          <button
            className="jp-WorkbenchPanel-iconButton"
            title="New serving notebook"
            onClick={this._onNewNotebook}
          >
            <addIcon.react tag="span" />
          </button>
          <button
            className="jp-WorkbenchPanel-iconButton"
            title="Refresh"
            data-action="refresh"
            onClick={() => void this.refresh()}
          >
            <refreshIcon.react tag="span" />
          </button>
        </div>
        {this._listError && <div className="jp-WorkbenchPanel-error">{this._listError}</div>}
        {servers === null && !this._listError && <div className="jp-WorkbenchPanel-empty">Looking for servers…</div>}
        {servers?.length === 0 && (
          <div className="jp-WorkbenchPanel-empty">
            <p>No workbench server is running in this Jupyter session.</p>
            <p>
              Start one from a notebook with <code>%serve start</code>, or from a terminal with{' '}
              <code>workbench serve</code>.
            </p>
            <button className="jp-mod-styled jp-mod-accept" onClick={this._onNewNotebook}>
              New serving notebook
            </button>
          </div>
        )}
        {servers?.map(server => (
          <ServerSection key={server.id} server={server} pending={this._pending} onAction={this._onAction} />
        ))}
      </>
    );
  }

  private async _refreshList(): Promise<void> {
    try {
      const listing = await this._api.servers();
      this._listing = listing;
      this._listError = null;
      this._history.retain(listing.servers.map(server => server.id));
    } catch (error) {
      this._listError = `Could not list the servers: ${messageOf(error)}`;
      this.update();
      throw error; // the poll backs off
    }
    this.update();
  }

  private async _refreshStats(): Promise<void> {
    const servers = (this._listing?.servers ?? []).filter(server => server.proxy_url && !server.error);
    // One server that stops between two listings must not stop the others' charts.
    await Promise.allSettled(
      servers.map(async server => this._history.record(server.id, await this._api.stats(server.proxy_url!)))
    );
    if (servers.length) {
      this.update();
    }
  }

  private _onAction = async (server: IServerView, model: IModelView, kind: ActionKind, version?: number) => {
    const action = describeAction(kind, model, version);
    if (action.needsConfirmation) {
      const accept =
        kind === 'unload' ? Dialog.warnButton({ label: action.accept }) : Dialog.okButton({ label: action.accept });
      const answer = await showDialog({
        title: action.title,
        body: action.message,
        buttons: [Dialog.cancelButton(), accept]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    const token = server.tokenRequired ? await this._token(server) : undefined;
    if (token === null) {
      return; // the user closed the token prompt
    }
    const key = pendingKey(model, kind, version);
    this._pending.add(key);
    this.update();
    try {
      await this._api.perform(server.proxyUrl!, action, token);
    } catch (error) {
      if (error instanceof WorkbenchRequestError && error.status === 401) {
        this._tokens.delete(server.id); // a wrong token is asked for again next time
      }
      void showErrorMessage(`${action.accept} failed`, messageOf(error));
    } finally {
      this._pending.delete(key);
      await this.refresh().catch(() => undefined);
    }
  };

  /** The server's management token, asked for once per server and kept in memory only; null if refused. */
  private async _token(server: IServerView): Promise<string | null> {
    const known = this._tokens.get(server.id);
    if (known) {
      return known;
    }
    const answer = await InputDialog.getPassword({
      title: `Management token of ${server.name}`,
      label: 'This server was started with --management_token; its changes need the token.'
    });
    if (!answer.button.accept || !answer.value) {
      return null;
    }
    this._tokens.set(server.id, answer.value);
    return answer.value;
  }

  private _api: WorkbenchAPI;
  private _onNewNotebook: () => void;
  private _listPoll: Poll;
  private _statsPoll: Poll;
  private _listing: IServerListing | null = null;
  private _listError: string | null = null;
  private _history = new StatsHistory();
  private _pending = new Set<string>();
  private _tokens = new Map<string, string>();
}

type ActionHandler = (server: IServerView, model: IModelView, kind: ActionKind, version?: number) => void;

function pendingKey(model: IModelView, kind: ActionKind, version?: number): string {
  return `${model.key}\n${kind}\n${version ?? ''}`;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function ServerSection(props: { server: IServerView; pending: Set<string>; onAction: ActionHandler }) {
  const { server } = props;
  return (
    <section className="jp-WorkbenchServer" data-server-id={server.id} data-server-name={server.name}>
      <div className="jp-WorkbenchServer-header" title={server.source ? `models from ${server.source}` : undefined}>
        <div className="jp-WorkbenchServer-name">{server.name}</div>
        <div className="jp-WorkbenchServer-endpoints">
          {server.endpoints.map(endpoint => (
            <span key={endpoint}>{endpoint}</span>
          ))}
        </div>
      </div>
      {server.error && <div className="jp-WorkbenchPanel-error">{server.error}</div>}
      {!server.error && server.models.length === 0 && (
        <div className="jp-WorkbenchPanel-empty">No models yet: export one with %serve export.</div>
      )}
      {server.models.map(model => (
        <ModelCard key={model.key} server={server} model={model} pending={props.pending} onAction={props.onAction} />
      ))}
    </section>
  );
}

function ModelCard(props: { server: IServerView; model: IModelView; pending: Set<string>; onAction: ActionHandler }) {
  const { server, model, pending, onAction } = props;
  const canAct = server.proxyUrl !== null;
  const rollingBack = pending.has(pendingKey(model, 'rollback'));
  return (
    <div className="jp-WorkbenchModel" data-model={model.name}>
      <div className="jp-WorkbenchModel-header">
        <span className="jp-WorkbenchModel-name" title={model.platform}>
          {model.name}
        </span>
        <span className="jp-WorkbenchModel-routing">{model.routing}</span>
        {model.registry !== null && (
          <span className="jp-WorkbenchModel-registry" title="the registry's aliases route this model">
            {model.registry}
          </span>
        )}
        {model.rollbackTo !== null && (
          <button
            className="jp-WorkbenchPanel-action"
            data-action="rollback"
            disabled={!canAct || rollingBack}
            title={`Make version ${model.rollbackTo} stable again`}
            onClick={() => onAction(server, model, 'rollback')}
          >
            {rollingBack ? 'Rolling back…' : `Roll back to v${model.rollbackTo}`}
          </button>
        )}
      </div>
      <div className="jp-WorkbenchModel-traffic">
        <Sparkline values={model.rpsSeries} label="requests per second" className="jp-mod-rate" />
        <span className="jp-WorkbenchModel-figure" data-figure="rps">
          {model.current ? `${formatRate(model.current.rps)} req/s` : 'no requests yet'}
        </span>
        <Sparkline values={model.p99Series} label="p99 latency" className="jp-mod-latency" />
        <span className="jp-WorkbenchModel-figure" data-figure="p99" title="p99 latency of the slowest version">
          p99 {formatMs(model.current?.p99 ?? null)}
        </span>
        {model.cache !== null && (
          <span
            className="jp-WorkbenchModel-figure"
            data-figure="cache"
            title={`response cache: ${model.cache.hits} hits, ${model.cache.misses} misses since the server started`}
          >
            {formatCache(model.cache)}
          </span>
        )}
      </div>
      <div className="jp-WorkbenchVersions">
          {model.versions.map(row => (
            <VersionRow
              key={row.version}
              row={row}
              canAct={canAct}
              pending={pending}
              model={model}
              onAction={(kind, version) => onAction(server, model, kind, version)}
            />
          ))}
      </div>
    </div>
  );
}

function VersionRow(props: {
  row: IVersionRow;
  model: IModelView;
  canAct: boolean;
  pending: Set<string>;
  onAction: (kind: ActionKind, version: number) => void;
}) {
  const { row, model, canAct, pending, onAction } = props;
  const busy = (kind: ActionKind) => pending.has(pendingKey(model, kind, row.version));
  return (
    <div className={`jp-WorkbenchVersion jp-mod-${row.status}`} data-version={row.version}>
      <span className="jp-WorkbenchVersion-number">v{row.version}</span>
      <span
        className="jp-WorkbenchVersion-state"
        title={row.unloadBlockedBy && row.status === 'serving' ? `${row.statusText}; ${row.unloadBlockedBy}` : row.statusText}
      >
        <span className="jp-WorkbenchVersion-dot" />
        {/* A serving version says so with its dot alone: the sidebar is narrow. */}
        {row.status === 'serving' ? '' : row.status === 'failed' ? 'failed' : row.statusText}
      </span>
      <span className="jp-WorkbenchVersion-labels">
        {row.labels.map(label => (
          <span key={label} className={`jp-WorkbenchLabel jp-mod-${LABEL_STYLES.has(label) ? label : 'other'}`}>
            {label}
          </span>
        ))}
        {row.aliases.map(alias => (
          <span key={alias} className="jp-WorkbenchLabel jp-mod-alias" title="the registry's alias naming this version">
            {alias}
          </span>
        ))}
      </span>
      <span
        className="jp-WorkbenchVersion-traffic"
        title={`share of the default traffic${row.rps !== null ? `; ${formatRate(row.rps)} requests/s now` : ''}`}
      >
        {row.traffic}
      </span>
      <span className="jp-WorkbenchVersion-actions">
        {row.canPromote && (
          <button
            className="jp-WorkbenchPanel-action"
            data-action="promote"
            disabled={!canAct || busy('promote')}
            title={`Make version ${row.version} the stable version`}
            onClick={() => onAction('promote', row.version)}
          >
            {busy('promote') ? 'Promoting…' : 'Promote'}
          </button>
        )}
        {row.canLoad && (
          <button
            className="jp-WorkbenchPanel-action"
            data-action="load"
            disabled={!canAct || busy('load')}
            onClick={() => onAction('load', row.version)}
          >
            {busy('load') ? 'Loading…' : 'Load'}
          </button>
        )}
        {/* The stable, the canary and a last serving version cannot be unloaded: no button, and room for labels. */}
        {row.canUnload && (
          <button
            className="jp-WorkbenchPanel-action jp-mod-warn"
            data-action="unload"
            disabled={!canAct || busy('unload')}
            title={`Unload version ${row.version}`}
            onClick={() => onAction('unload', row.version)}
          >
            {busy('unload') ? 'Unloading…' : 'Unload'}
          </button>
        )}
      </span>
    </div>
  );
}

/** Labels drawn in a colour of their own; the server puts the canary's label in the version's labels. */
const LABEL_STYLES = new Set(['stable', 'canary']);

const SPARK_WIDTH = 56;
const SPARK_HEIGHT = 18;

function Sparkline(props: { values: ReadonlyArray<number | null>; label: string; className: string }) {
  return (
    <svg
      className={`jp-WorkbenchSparkline ${props.className}`}
      width={SPARK_WIDTH}
      height={SPARK_HEIGHT}
      viewBox={`0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`}
      role="img"
      aria-label={`${props.label}, last ${HISTORY_POINTS} seconds`}
    >
      <path d={sparklinePath(props.values, SPARK_WIDTH, SPARK_HEIGHT)} />
    </svg>
  );
}
