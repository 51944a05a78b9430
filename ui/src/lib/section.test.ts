import { describe, expect, it, vi } from 'vitest';
import { Loader, Writes } from './section.svelte';

/** A promise and the functions that settle it, for looking at state while a write is under way. */
function deferred<T>() {
  let resolve!: (value: T) => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<T>((ok, fail) => {
    resolve = ok;
    reject = fail;
  });
  return { promise, resolve, reject };
}

describe('Loader', () => {
  it('keeps a failed read\'s message and clears it once a read succeeds', async () => {
    let fail = true;
    const loader = new Loader(async () => {
      if (fail) throw new Error('permission denied');
    });
    expect(loader.loaded).toBe(false);
    await loader.load();
    expect(loader.failure).toBe('permission denied');
    expect(loader.loaded).toBe(true);
    fail = false;
    await loader.load();
    expect(loader.failure).toBe('');
  });

  it('is loaded only once the first read has ended', async () => {
    const read = deferred<void>();
    const loader = new Loader(() => read.promise);
    const loading = loader.load();
    expect(loader.loaded).toBe(false);
    read.resolve();
    await loading;
    expect(loader.loaded).toBe(true);
  });

  it('starts once however often start is called', async () => {
    const read = vi.fn(async () => {});
    const loader = new Loader(read);
    loader.start();
    loader.start();
    await vi.waitFor(() => expect(loader.loaded).toBe(true));
    loader.start();
    expect(read).toHaveBeenCalledTimes(1);
    await loader.load();
    expect(read).toHaveBeenCalledTimes(2);
  });
});

describe('Writes', () => {
  it('is busy during the write and the reload, and reloads after it', async () => {
    const write = deferred<void>();
    const reload = deferred<void>();
    const reloads = vi.fn(() => reload.promise);
    const writes = new Writes(reloads);
    const running = writes.run(() => write.promise);
    expect(writes.busy).toBe(true);
    write.resolve();
    await vi.waitFor(() => expect(reloads).toHaveBeenCalledTimes(1));
    expect(writes.busy).toBe(true);
    reload.resolve();
    expect(await running).toBe(true);
    expect(writes.busy).toBe(false);
  });

  it('shows a string the write answers as the notice, and nothing for other answers', async () => {
    const writes = new Writes();
    await writes.run(async () => 'Secret HF_TOKEN set.');
    expect(writes.notice).toBe('Secret HF_TOKEN set.');
    await writes.run(async () => ({ name: 'HF_TOKEN' }));
    expect(writes.notice).toBe('');
    expect(writes.error).toBe('');
  });

  it('keeps a notice the write set itself when it answers none', async () => {
    const writes = new Writes();
    await writes.run(async () => {
      writes.notice = 'Uploading data.tar.gz…';
    });
    expect(writes.notice).toBe('Uploading data.tar.gz…');
  });

  it('keeps a failed write\'s message, does not reload, and clears it on the next write', async () => {
    const reload = vi.fn(async () => {});
    const writes = new Writes(reload);
    writes.notice = 'Secret A set.';
    expect(await writes.run(async () => Promise.reject(new Error('needs maintainer')))).toBe(false);
    expect(writes.error).toBe('needs maintainer');
    expect(writes.notice).toBe('');
    expect(writes.busy).toBe(false);
    expect(reload).not.toHaveBeenCalled();
    expect(await writes.run(async () => {})).toBe(true);
    expect(writes.error).toBe('');
    expect(reload).toHaveBeenCalledTimes(1);
  });
});
