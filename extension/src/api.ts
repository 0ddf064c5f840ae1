/**
 * Requests to the Jupyter server extension (workbench/jupyter): the server listing, and each server's REST API
 * through the authenticated proxy. Every request goes through ServerConnection, so it carries Jupyter's own
 * authentication and XSRF token; the model servers' ports are never reached directly.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { errorMessage, type IAction } from './model';
import type { IModelInfo, IServerListing, IStatsSnapshot } from './types';

/** A failed request, with the server's own message. */
export class WorkbenchRequestError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/** The header the proxy turns into the model server's `Authorization: Bearer` for its management API. */
const TOKEN_HEADER = 'X-Workbench-Token';

export class WorkbenchAPI {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** Every running server of this Jupyter session with its models. */
  async servers(): Promise<IServerListing> {
    const url = URLExt.join(this.settings.baseUrl, 'workbench/api/servers');
    return (await this._json(url, { method: 'GET' })) as IServerListing;
  }

  /** A server's statistics snapshot, through the proxy. */
  async stats(proxyUrl: string): Promise<IStatsSnapshot> {
    return (await this._json(this._proxied(proxyUrl, 'workbench/v1/stats'), { method: 'GET' })) as IStatsSnapshot;
  }

  /** Send a management action; answers the model's new description. */
  async perform(proxyUrl: string, action: IAction, token?: string): Promise<IModelInfo> {
    const headers: Record<string, string> = { 'Content-Type': 'application/json' };
    if (token) {
      headers[TOKEN_HEADER] = token;
    }
    const init = { method: 'POST', headers, body: JSON.stringify(action.body) };
    return (await this._json(this._proxied(proxyUrl, action.path), init)) as IModelInfo;
  }

  /** `proxy_url` is an absolute path under Jupyter's base URL; make it a full URL on this page's origin. */
  private _proxied(proxyUrl: string, path: string): string {
    return new URL(URLExt.join(proxyUrl, path), this.settings.baseUrl).toString();
  }

  private async _json(url: string, init: RequestInit): Promise<unknown> {
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new WorkbenchRequestError(0, `Jupyter server did not answer: ${String(error)}`);
    }
    const text = await response.text();
    if (!response.ok) {
      throw new WorkbenchRequestError(response.status, errorMessage(response.status, text));
    }
    try {
      return JSON.parse(text);
    } catch {
      throw new WorkbenchRequestError(response.status, `not JSON: ${text.slice(0, 200)}`);
    }
  }
}
