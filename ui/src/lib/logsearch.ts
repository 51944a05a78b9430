// The batch page's search of its items' logs (BatchLogService/SearchBatchLogs, served by
// log-ingest): the request the form makes, and the line that sums up an answer.

import type { ItemStateName } from './types';

/** Which attempts a search looks at: every one, or those that ended one way. */
export type AttemptFilter = 'all' | 'succeeded' | 'failed' | 'dead';

export const ATTEMPT_FILTERS: readonly { value: AttemptFilter; label: string }[] = [
  { value: 'all', label: 'All attempts' },
  { value: 'succeeded', label: 'Succeeded' },
  { value: 'failed', label: 'Failed (retried)' },
  { value: 'dead', label: 'Dead' },
];

const STATES: Record<AttemptFilter, ItemStateName> = {
  all: 'ITEM_STATE_UNSPECIFIED',
  succeeded: 'ITEM_STATE_SUCCEEDED',
  failed: 'ITEM_STATE_FAILED',
  dead: 'ITEM_STATE_DEAD',
};

/** Lines one search asks for (the service's default; it allows up to 100,000). */
export const SEARCH_LIMIT = 1000;

export interface LogSearchForm {
  pattern: string;
  regex: boolean;
  attempts: AttemptFilter;
}

export interface SearchBatchLogsRequest {
  batchId: string;
  pattern: string;
  regex: boolean;
  state: ItemStateName;
  limit: number;
}

/**
 * The request of a form, or undefined when there is nothing to search for: an empty pattern.
 * The pattern is sent as typed (spaces are part of a substring); a regular expression is
 * checked by the server (Rust syntax, not JavaScript's).
 */
export function searchRequest(batchId: string, form: LogSearchForm, limit = SEARCH_LIMIT): SearchBatchLogsRequest | undefined {
  if (form.pattern === '') return undefined;
  return { batchId, pattern: form.pattern, regex: form.regex, state: STATES[form.attempts], limit };
}

/** What an answer of `lines` lines says, `truncated` when more lines matched than were sent. */
export function resultSummary(lines: number, truncated: boolean): string {
  if (truncated) return `First ${lines.toLocaleString()} lines shown; more matched.`;
  if (lines === 0) return 'No line matched.';
  return `${lines.toLocaleString()} matching line${lines === 1 ? '' : 's'}.`;
}
