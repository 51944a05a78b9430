// The Runs page's filter box: `state:RUNNING project:x user:y sweep:z lr>0.01 loss<0.5 word`.
// `field:value` matches a job's field, `key OP value` compares a config value or the latest
// value of a metric (`best(key) OP value` its best value), and a bare word matches the name or id.

export type Op = '<' | '<=' | '>' | '>=' | '=' | '!=';

export type Term =
  | { kind: 'field'; field: 'state' | 'project' | 'user' | 'sweep' | 'name' | 'id'; value: string }
  | { kind: 'compare'; key: string; op: Op; value: number | string }
  | { kind: 'text'; value: string };

export interface ParsedFilter {
  terms: Term[];
  /** Parts that could not be read, with why; they are left out of the filter. */
  errors: string[];
}

const FIELDS = new Set(['state', 'project', 'user', 'sweep', 'name', 'id']);
// Longest operators first so `<=` is not read as `<` followed by `=value`.
const COMPARISON = /^([^<>=!\s]+)\s*(<=|>=|!=|==|<|>|=)\s*(.+)$/;

/** Splits on whitespace, keeping "double quoted" parts together (quotes removed). */
export function tokenize(input: string): string[] {
  const tokens: string[] = [];
  let current = '';
  let quoted = false;
  let any = false;
  for (const ch of input) {
    if (ch === '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && /\s/.test(ch)) {
      if (any) tokens.push(current);
      current = '';
      any = false;
    } else {
      current += ch;
      any = true;
    }
  }
  if (any) tokens.push(current);
  return tokens;
}

export function parseFilter(input: string): ParsedFilter {
  const terms: Term[] = [];
  const errors: string[] = [];
  for (const token of tokenize(input)) {
    const colon = token.indexOf(':');
    const comparison = COMPARISON.exec(token);
    if (comparison && (colon < 0 || colon > comparison[1].length)) {
      const [, key, rawOp, rawValue] = comparison;
      const op = (rawOp === '==' ? '=' : rawOp) as Op;
      const number = Number(rawValue);
      const value = rawValue.trim() !== '' && Number.isFinite(number) ? number : rawValue;
      if (typeof value === 'string' && op !== '=' && op !== '!=') {
        errors.push(`${token}: ${op} needs a number`);
        continue;
      }
      terms.push({ kind: 'compare', key, op, value });
    } else if (colon > 0 && FIELDS.has(token.slice(0, colon).toLowerCase())) {
      const field = token.slice(0, colon).toLowerCase() as Extract<Term, { kind: 'field' }>['field'];
      const value = token.slice(colon + 1);
      if (!value) {
        errors.push(`${token}: no value`);
        continue;
      }
      terms.push({ kind: 'field', field, value });
    } else {
      terms.push({ kind: 'text', value: token });
    }
  }
  return { terms, errors };
}

/** What a term is checked against: a job's fields and its keyed values (config, then metrics). */
export interface FilterSubject {
  state: string;
  project: string;
  /** The owner's name when known, else their id; `userId` is the id. */
  user: string;
  userId?: string;
  sweep: string;
  name: string;
  id: string;
  /** A config value or metric value by key; undefined when the run has neither. */
  value: (key: string) => number | string | boolean | undefined;
}

function compare(actual: number | string | boolean | undefined, op: Op, expected: number | string): boolean {
  if (actual === undefined) return op === '!=';
  if (typeof expected === 'number') {
    const number = typeof actual === 'number' ? actual : typeof actual === 'boolean' ? Number(actual) : Number(actual);
    if (Number.isNaN(number)) return op === '!=';
    switch (op) {
      case '<': return number < expected;
      case '<=': return number <= expected;
      case '>': return number > expected;
      case '>=': return number >= expected;
      case '=': return number === expected;
      case '!=': return number !== expected;
    }
  }
  const equal = String(actual).toLowerCase() === expected.toLowerCase();
  return op === '!=' ? !equal : equal;
}

function matchesField(subject: FilterSubject, field: Extract<Term, { kind: 'field' }>['field'], value: string): boolean {
  const wanted = value.toLowerCase();
  if (field === 'state') {
    // `state:running` and `state:JOB_STATE_RUNNING` both match; prefixes too (`state:succ`).
    const state = subject.state.toLowerCase().replace(/^job_state_/, '');
    return state.startsWith(wanted.replace(/^job_state_/, ''));
  }
  if (field === 'name') return subject.name.toLowerCase().includes(wanted);
  if (field === 'id') return subject.id.toLowerCase().includes(wanted);
  if (field === 'user') return subject.user.toLowerCase() === wanted || subject.userId?.toLowerCase() === wanted;
  return subject[field].toLowerCase() === wanted;
}

/** Whether a run passes every term (terms are ANDed). */
export function matches(terms: Term[], subject: FilterSubject): boolean {
  for (const term of terms) {
    if (term.kind === 'field') {
      if (!matchesField(subject, term.field, term.value)) return false;
    } else if (term.kind === 'compare') {
      if (!compare(subject.value(term.key), term.op, term.value)) return false;
    } else {
      const text = term.value.toLowerCase();
      if (!subject.name.toLowerCase().includes(text) && !subject.id.toLowerCase().includes(text)) return false;
    }
  }
  return true;
}

/** The keys compared by a filter (the Runs page fetches these metrics for every run). */
export function comparedKeys(terms: Term[]): string[] {
  return [...new Set(terms.flatMap((term) => (term.kind === 'compare' ? [term.key] : [])))];
}
