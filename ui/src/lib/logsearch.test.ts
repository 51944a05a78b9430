import { describe, expect, it } from 'vitest';
import { ATTEMPT_FILTERS, resultSummary, SEARCH_LIMIT, searchRequest } from './logsearch';

describe('searchRequest', () => {
  it('sends a substring over every attempt by default', () => {
    expect(searchRequest('b1', { pattern: 'out of memory', regex: false, attempts: 'all' })).toEqual({
      batchId: 'b1', pattern: 'out of memory', regex: false, state: 'ITEM_STATE_UNSPECIFIED', limit: SEARCH_LIMIT,
    });
  });

  it('names the attempts\' state as the API spells it', () => {
    const states = ATTEMPT_FILTERS.map(({ value }) => searchRequest('b1', { pattern: 'x', regex: false, attempts: value })?.state);
    expect(states).toEqual(['ITEM_STATE_UNSPECIFIED', 'ITEM_STATE_SUCCEEDED', 'ITEM_STATE_FAILED', 'ITEM_STATE_DEAD']);
  });

  it('keeps a regular expression and spaces as typed, and a limit', () => {
    expect(searchRequest('b1', { pattern: ' ^item \\d+$', regex: true, attempts: 'dead' }, 50)).toEqual({
      batchId: 'b1', pattern: ' ^item \\d+$', regex: true, state: 'ITEM_STATE_DEAD', limit: 50,
    });
  });

  it('has nothing to send without a pattern', () => {
    expect(searchRequest('b1', { pattern: '', regex: true, attempts: 'all' })).toBeUndefined();
  });
});

describe('resultSummary', () => {
  it('says when more lines matched than were shown', () => {
    expect(resultSummary(500, true)).toBe('First 500 lines shown; more matched.');
  });

  it('counts the lines, or says none matched', () => {
    expect(resultSummary(0, false)).toBe('No line matched.');
    expect(resultSummary(1, false)).toBe('1 matching line.');
    expect(resultSummary(3, false)).toBe('3 matching lines.');
  });
});
