// The one client of kiln's HTTP API (docs/http-api.md): every route the UI calls goes through
// this module. Unary calls are `rpc`, server-streaming ones `stream` (server-sent events).

import type { WhoAmI } from './types';

/** An error the API answered: `{"code": "not_found", "message": "..."}` with its HTTP status. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Where a 401 sends the user: the login page, remembering where they were. */
let onUnauthenticated: () => void = () => {
  if (location.pathname !== '/login') location.assign('/login');
};

/** Lets the app send 401s through its router instead of a full page load. */
export function setUnauthenticatedHandler(handler: () => void): void {
  onUnauthenticated = handler;
}

// Every POST carries the CSRF header (a cross-site form cannot send one) and the session
// cookie, which the browser only sends to the same origin.
async function post(path: string, body: unknown): Promise<Response> {
  return fetch(path, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json', 'X-Kiln-Csrf': '1' },
    body: JSON.stringify(body ?? {}),
  });
}

async function errorOf(response: Response): Promise<ApiError> {
  let code = 'unknown';
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (typeof body?.code === 'string') code = body.code;
    if (typeof body?.message === 'string') message = body.message;
  } catch {
    // Not JSON (a proxy's error page): keep the status line.
  }
  return new ApiError(response.status, code, message);
}

/** Calls a unary method (`rpc('JobService', 'GetJob', {jobId})`) and returns its response. */
export async function rpc<T>(service: string, method: string, request: object = {}): Promise<T> {
  const response = await post(`/api/v1/rpc/${service}/${method}`, request);
  if (response.status === 401) onUnauthenticated();
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as T;
}

/** What `POST /api/v1/upload` answers: the stored file's sha256, its size, whether it was new. */
export interface Uploaded {
  digest: string;
  size: number | string;
  created: boolean;
}

/**
 * Uploads a file's bytes as a blob of `project` (what `kiln dataset create` uploads before it
 * names the archive); the body is the file itself, so nothing is read into the page's memory.
 */
export async function upload(project: string, file: Blob): Promise<Uploaded> {
  const response = await fetch(`/api/v1/upload?project=${encodeURIComponent(project)}`, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'Content-Type': 'application/octet-stream', 'X-Kiln-Csrf': '1' },
    body: file,
  });
  if (response.status === 401) onUnauthenticated();
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as Uploaded;
}

export interface StreamHandlers<T> {
  /** The connection is open (again, after a reconnect); messages may still be a while. */
  onOpen?: () => void;
  /** One response message; `id` is the event id (a log line's seq), when the server set one. */
  onMessage: (message: T, id: string) => void;
  /** The stream ended normally. */
  onEnd?: () => void;
  /** The server ended the stream with an error, or the connection could not be (re)made. */
  onError?: (error: ApiError) => void;
}

/**
 * Opens a server-streaming method as server-sent events. The browser's EventSource reconnects
 * by itself after a dropped connection, sending `Last-Event-ID`, so a log stream resumes after
 * its last line. Returns a function that closes the stream.
 */
export function stream<T>(service: string, method: string, request: object, handlers: StreamHandlers<T>): () => void {
  const url = `/api/v1/stream/${service}/${method}?request=${encodeURIComponent(JSON.stringify(request))}`;
  const source = new EventSource(url, { withCredentials: false });
  source.addEventListener('open', () => handlers.onOpen?.());
  source.addEventListener('message', (event) => {
    handlers.onMessage(JSON.parse(event.data) as T, event.lastEventId);
  });
  source.addEventListener('end', () => {
    source.close();
    handlers.onEnd?.();
  });
  source.addEventListener('error', (event) => {
    const data = (event as MessageEvent).data;
    if (typeof data === 'string' && data) {
      // The server's own `error` event: the stream is over, do not reconnect.
      source.close();
      let code = 'unknown';
      let message = data;
      try {
        ({ code, message } = JSON.parse(data));
      } catch {
        // keep the raw text
      }
      handlers.onError?.(new ApiError(code === 'unauthenticated' ? 401 : 0, code, message));
      if (code === 'unauthenticated') onUnauthenticated();
      return;
    }
    if (source.readyState === EventSource.CLOSED) {
      // The browser gave up (an HTTP error answer such as 401): find out whether the session
      // is gone, which sends the user to the login page.
      handlers.onError?.(new ApiError(0, 'unavailable', 'the stream could not be opened'));
      void whoAmI().catch(() => {});
    }
    // Otherwise the browser is reconnecting by itself.
  });
  return () => source.close();
}

/** Signs in with a token; the server sets the session cookie. */
export async function login(token: string): Promise<WhoAmI> {
  const response = await post('/api/v1/login', { token });
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as WhoAmI;
}

/** A login this browser asked for: the code its page shows, valid until `expiresAtMs`. */
export interface PendingLogin {
  code: string;
  expiresAtMs: number;
}

/**
 * Asks for a login that a user approves from the CLI (`kiln ui`). The server keeps its nonce
 * in an HttpOnly cookie that only this browser sends back, so only this browser can redeem it.
 */
export async function askForLogin(): Promise<PendingLogin> {
  const response = await post('/api/v1/login/pending', {});
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as PendingLogin;
}

/**
 * Redeems this browser's login: `undefined` while its code waits for approval, the user once
 * approved (the server sets the session cookie). A used, expired or cancelled login throws.
 */
export async function redeemLogin(): Promise<WhoAmI | undefined> {
  const response = await post('/api/v1/login/pending/redeem', {});
  if (response.status === 202) return undefined;
  if (!response.ok) throw await errorOf(response);
  return (await response.json()) as WhoAmI;
}

export async function logout(): Promise<void> {
  const response = await post('/api/v1/logout', {});
  if (!response.ok && response.status !== 401) throw await errorOf(response);
}

export function whoAmI(): Promise<WhoAmI> {
  return rpc<WhoAmI>('NodeService', 'WhoAmI');
}

/**
 * The address that downloads what a server-streaming file method sends (`GetOutput`,
 * `GetRunArtifact`): a plain link, so the browser streams it to disk, saved as `filename`.
 */
export function downloadUrl(service: string, method: string, request: object, filename: string): string {
  const query = `request=${encodeURIComponent(JSON.stringify(request))}&filename=${encodeURIComponent(filename)}`;
  return `/api/v1/download/${service}/${method}?${query}`;
}
