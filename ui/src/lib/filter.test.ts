import { describe, expect, it } from 'vitest';
import { matches, parseFilter, tokenize, type FilterSubject } from './filter';

function subject(overrides: Partial<FilterSubject> = {}, values: Record<string, number | string> = {}): FilterSubject {
  return {
    state: 'JOB_STATE_RUNNING', project: 'vision', user: 'ada', sweep: '', name: 'train-resnet', id: '01abc',
    value: (key) => values[key],
    ...overrides,
  };
}

describe('parseFilter', () => {
  it('reads fields, comparisons and words', () => {
    const { terms, errors } = parseFilter('state:RUNNING project:x lr>0.01 loss<=0.5 opt=adam resnet');
    expect(errors).toEqual([]);
    expect(terms).toEqual([
      { kind: 'field', field: 'state', value: 'RUNNING' },
      { kind: 'field', field: 'project', value: 'x' },
      { kind: 'compare', key: 'lr', op: '>', value: 0.01 },
      { kind: 'compare', key: 'loss', op: '<=', value: 0.5 },
      { kind: 'compare', key: 'opt', op: '=', value: 'adam' },
      { kind: 'text', value: 'resnet' },
    ]);
  });

  it('keeps metric keys with slashes and reads == as =', () => {
    expect(parseFilter('val/loss==0.25').terms).toEqual([{ kind: 'compare', key: 'val/loss', op: '=', value: 0.25 }]);
  });

  it('reports an ordering against text and an empty field', () => {
    const { terms, errors } = parseFilter('lr>abc state:');
    expect(terms).toEqual([]);
    expect(errors).toHaveLength(2);
  });

  it('keeps quoted values together', () => {
    expect(tokenize('name:"my run" x')).toEqual(['name:my run', 'x']);
  });
});

describe('matches', () => {
  it('matches states by suffix, case-insensitively', () => {
    expect(matches(parseFilter('state:running').terms, subject())).toBe(true);
    expect(matches(parseFilter('state:SUCCEEDED').terms, subject())).toBe(false);
  });

  it('compares numbers, and fails on a missing key', () => {
    const run = subject({}, { lr: 0.1, loss: 0.7 });
    expect(matches(parseFilter('lr>0.01').terms, run)).toBe(true);
    expect(matches(parseFilter('loss<0.5').terms, run)).toBe(false);
    expect(matches(parseFilter('acc>0').terms, run)).toBe(false);
    expect(matches(parseFilter('acc!=1').terms, run)).toBe(true);
  });

  it('matches a user by name or by id', () => {
    const run = subject({ user: 'ada', userId: '01u1' });
    expect(matches(parseFilter('user:ADA').terms, run)).toBe(true);
    expect(matches(parseFilter('user:01u1').terms, run)).toBe(true);
    expect(matches(parseFilter('user:bob').terms, run)).toBe(false);
  });

  it('ANDs every term', () => {
    const run = subject({}, { lr: 0.1 });
    expect(matches(parseFilter('project:vision user:ada lr>=0.1 resnet').terms, run)).toBe(true);
    expect(matches(parseFilter('project:vision user:bob').terms, run)).toBe(false);
  });

  it('compares strings for equality only', () => {
    const run = subject({}, { opt: 'Adam' });
    expect(matches(parseFilter('opt=adam').terms, run)).toBe(true);
    expect(matches(parseFilter('opt!=adam').terms, run)).toBe(false);
  });
});
