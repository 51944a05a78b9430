// Live pages poll: the next call starts POLL_INTERVAL_MS after the last one answered, so a
// slow server never has calls piling up. Polling pauses while the tab is hidden.

/** How often live pages refresh (the Runs table, batch counters, a running job's charts). */
export const POLL_INTERVAL_MS = 2000;

/** Calls `tick` now and then every interval until the returned function is called. */
export function poll(tick: () => Promise<void> | void, intervalMs = POLL_INTERVAL_MS): () => void {
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const run = async () => {
    if (stopped) return;
    if (document.visibilityState !== 'hidden') {
      try {
        await tick();
      } catch {
        // The page shows its own error; polling goes on.
      }
    }
    if (!stopped) timer = setTimeout(run, intervalMs);
  };
  void run();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
