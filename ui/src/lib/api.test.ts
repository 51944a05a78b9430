import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ApiError, askForLogin, login, redeemLogin, rpc, setUnauthenticatedHandler, upload } from './api';

function answer(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } });
}

describe('rpc', () => {
  const fetchMock = vi.fn();
  beforeEach(() => {
    fetchMock.mockReset();
    vi.stubGlobal('fetch', fetchMock);
  });
  afterEach(() => vi.unstubAllGlobals());

  it('posts JSON with the CSRF header and the session cookie', async () => {
    fetchMock.mockResolvedValue(answer(200, { id: 'j1' }));
    expect(await rpc('JobService', 'GetJob', { jobId: 'j1' })).toEqual({ id: 'j1' });
    const [url, init] = fetchMock.mock.calls[0];
    expect(url).toBe('/api/v1/rpc/JobService/GetJob');
    expect(init.method).toBe('POST');
    expect(init.credentials).toBe('same-origin');
    expect(init.headers).toEqual({ 'Content-Type': 'application/json', 'X-Kiln-Csrf': '1' });
    expect(JSON.parse(init.body)).toEqual({ jobId: 'j1' });
  });

  it('throws the server\'s code and message with the status', async () => {
    fetchMock.mockResolvedValue(answer(403, { code: 'permission_denied', message: 'needs maintainer' }));
    const error = (await rpc('JobService', 'StopJob', {}).catch((e: unknown) => e)) as ApiError;
    expect(error).toBeInstanceOf(ApiError);
    expect([error.status, error.code, error.message]).toEqual([403, 'permission_denied', 'needs maintainer']);
  });

  it('keeps the status line when the error body is not JSON', async () => {
    fetchMock.mockResolvedValue(new Response('<html>bad gateway</html>', { status: 502, statusText: 'Bad Gateway' }));
    const error = (await rpc('JobService', 'ListJobs').catch((e: unknown) => e)) as ApiError;
    expect([error.status, error.code, error.message]).toEqual([502, 'unknown', '502 Bad Gateway']);
  });

  it('sends a 401 to the sign-in handler', async () => {
    const handler = vi.fn();
    setUnauthenticatedHandler(handler);
    fetchMock.mockResolvedValue(answer(401, { code: 'unauthenticated', message: 'no session' }));
    await expect(rpc('JobService', 'ListJobs')).rejects.toThrow('no session');
    expect(handler).toHaveBeenCalledOnce();
  });

  it('does not treat a refused login token as a lost session', async () => {
    const handler = vi.fn();
    setUnauthenticatedHandler(handler);
    fetchMock.mockResolvedValue(answer(401, { code: 'unauthenticated', message: 'bad token' }));
    await expect(login('kiln_x')).rejects.toMatchObject({ status: 401 });
    expect(handler).not.toHaveBeenCalled();
  });

  it('asks for a login and redeems it: waiting on 202, the user once approved, refusals thrown', async () => {
    const handler = vi.fn();
    setUnauthenticatedHandler(handler);
    fetchMock.mockResolvedValueOnce(answer(200, { code: 'BCDF-GHJK', expiresAtMs: 1 }));
    expect(await askForLogin()).toEqual({ code: 'BCDF-GHJK', expiresAtMs: 1 });
    const [url, init] = fetchMock.mock.calls[0];
    expect([url, init.method, init.credentials, init.headers['X-Kiln-Csrf']]).toEqual(['/api/v1/login/pending', 'POST', 'same-origin', '1']);
    fetchMock.mockResolvedValueOnce(answer(202, { state: 'waiting', expiresAtMs: 1 }));
    expect(await redeemLogin()).toBeUndefined();
    fetchMock.mockResolvedValueOnce(answer(200, { user: 'ada' }));
    expect(await redeemLogin()).toEqual({ user: 'ada' });
    expect(fetchMock.mock.calls[2][0]).toBe('/api/v1/login/pending/redeem');
    fetchMock.mockResolvedValueOnce(answer(401, { code: 'unauthenticated', message: 'this browser has no login waiting' }));
    await expect(redeemLogin()).rejects.toMatchObject({ status: 401, message: 'this browser has no login waiting' });
    expect(handler).not.toHaveBeenCalled();
  });

  it('uploads a file as the raw body with the CSRF header, to the named project', async () => {
    fetchMock.mockResolvedValue(answer(200, { digest: 'ab12', size: 3, created: true }));
    const file = new Blob(['abc']);
    expect(await upload('vision lab', file)).toEqual({ digest: 'ab12', size: 3, created: true });
    const [url, init] = fetchMock.mock.calls[0];
    expect(url).toBe('/api/v1/upload?project=vision%20lab');
    expect([init.method, init.credentials, init.body]).toEqual(['POST', 'same-origin', file]);
    expect(init.headers).toEqual({ 'Content-Type': 'application/octet-stream', 'X-Kiln-Csrf': '1' });
    fetchMock.mockResolvedValue(answer(403, { code: 'permission_denied', message: 'needs member' }));
    await expect(upload('vision', file)).rejects.toMatchObject({ status: 403, code: 'permission_denied' });
  });
});
