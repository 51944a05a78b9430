// The two halves of a page section that lists something and changes it: a Loader reads the list
// (keeping the failure to show, so a load never throws), and Writes runs the changes one at a time
// (busy while one is under way, its error or its notice kept to show), reloading after each.
// Both keep only the state a section shows about them; the data stays the component's own, set by
// the callbacks, so a component's template reads its data as it always did.

/** The message to show for a caught error. */
const messageOf = (error: unknown) => (error as Error).message;

/** Reads a section's data through `read`, which assigns it; a failed read's message is `failure`. */
export class Loader {
  /** The last read's error message; empty once a read succeeds. */
  failure = $state('');
  /** True once the first read has ended, well or not (to tell "nothing yet" from "none"). */
  loaded = $state(false);
  readonly #read: () => Promise<void>;
  #started = false;

  constructor(read: () => Promise<void>) {
    this.#read = read;
  }

  /** Reads again; never throws. Called from an `$effect`, what `read` reads before its first `await` is tracked. */
  async load(): Promise<void> {
    try {
      await this.#read();
      this.failure = '';
    } catch (error) {
      this.failure = messageOf(error);
    }
    this.loaded = true;
  }

  /** Reads the first time it is called and does nothing after: for an `$effect` that waits for a permission. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    void this.load();
  }
}

/** Runs a section's writes: each clears the last error and notice, and `reload` follows a write that succeeded. */
export class Writes {
  /** True while a write (and the reload after it) is under way: what disables the section's buttons. */
  busy = $state(false);
  /** The last write's error message. */
  error = $state('');
  /** What the last write said it did: the string it answered, if it answered one. */
  notice = $state('');
  readonly #reload: () => Promise<unknown>;

  constructor(reload: () => Promise<unknown> = async () => {}) {
    this.#reload = reload;
  }

  /** Runs `write`, then the reload; answers whether the write succeeded. Never throws. */
  async run(write: () => Promise<unknown>): Promise<boolean> {
    this.busy = true;
    this.error = '';
    this.notice = '';
    try {
      const answer = await write();
      if (typeof answer === 'string') this.notice = answer;
      await this.#reload();
      return true;
    } catch (error) {
      this.error = messageOf(error);
      return false;
    } finally {
      this.busy = false;
    }
  }
}
