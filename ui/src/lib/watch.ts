// A page's list kept current by its change feed (lib/feed.ts), or by polling its List method
// while the api has no feed: the Runs, Batches, Sweeps and Services pages.

import { rpc, stream } from './api';
import { applyChanges, changesOf, emptyList, type Changes, type FeedMessage, type FeedOptions, type ListFeed, type LiveList } from './feed';
import { poll } from './poll';

/** After the feed failed (an api without it answers not_found), the list is polled and the
 * feed tried again this much later. */
const FEED_RETRY_MS = 60_000;
/** A watch that ends sooner than this after it was opened counts as a failure. */
const FEED_MIN_MS = 10_000;

export interface WatchOptions<T> extends FeedOptions<T> {
  /** How often the list is polled while the feed is down (POLL_INTERVAL_MS when absent). */
  intervalMs?: number;
  /** The list changed: by a message of the feed (`changes`), by `apply`, or listed anew while
   * polling (`changes` undefined; the list is whole). */
  onChange: (list: LiveList<T>, changes?: Changes<T>) => void;
  /** Listing failed while polling (the feed's own failures are what polling is for). */
  onError: (error: Error) => void;
}

export interface Watch<T> {
  /** Whether the feed is down and the list comes from polling, until the feed answers again. */
  readonly polling: boolean;
  /** Applies records read another way (after an action, a GetJob) as a message of the feed. */
  apply: (records: T[]) => void;
  close: () => void;
}

/** Watches the list `request` (the List method's request) of `feed`; close it with the page. */
export function watchList<T>(feed: ListFeed<T>, request: object, options: WatchOptions<T>): Watch<T> {
  let list = emptyList<T>();
  let polling = false;
  let closed = false;
  let closeStream: (() => void) | undefined;
  let stopPolling: (() => void) | undefined;
  let retry: ReturnType<typeof setTimeout> | undefined;

  function changed(changes: Changes<T>) {
    list = applyChanges(list, changes, feed, options);
    options.onChange(list, changes);
  }

  function open() {
    // A watch ends after a while (the api checks the caller's access again): a new one goes on
    // after the last change this list has, or lists again when it has none.
    const watchRequest = list.seq > 0 ? { list: request, afterSeq: list.seq } : { list: request };
    const openedAtMs = Date.now();
    closeStream = stream<FeedMessage>(feed.service, feed.watch, watchRequest, {
      onMessage: (message) => {
        polling = false;
        stopPolling?.();
        stopPolling = undefined;
        changed(changesOf(feed, message));
      },
      onEnd: () => {
        closeStream = undefined;
        // A watch that ends at once is not a feed to lean on (nor to open again and again).
        if (Date.now() - openedAtMs < FEED_MIN_MS) failed();
        else if (!closed) open();
      },
      onError: () => {
        closeStream = undefined;
        failed();
      },
    });
  }

  function failed() {
    if (closed) return;
    polling = true;
    stopPolling ??= poll(listAgain, options.intervalMs);
    clearTimeout(retry);
    retry = setTimeout(open, FEED_RETRY_MS);
  }

  async function listAgain() {
    try {
      const response = await rpc<Record<string, T[] | undefined>>(feed.service, feed.list, request);
      if (!polling) return;
      list = { records: response[feed.field] ?? [], seq: 0, complete: true };
      options.onChange(list);
    } catch (error) {
      if (polling) options.onError(error as Error);
    }
  }

  open();
  return {
    get polling() {
      return polling;
    },
    apply: (records) => changed({ records, seq: 0, reset: false }),
    close: () => {
      closed = true;
      polling = false;
      closeStream?.();
      stopPolling?.();
      clearTimeout(retry);
    },
  };
}
