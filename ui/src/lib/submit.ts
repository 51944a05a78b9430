// The Submit page's form as `kiln run` sees it: the SubmitJobRequest the CLI builds from the same
// flags (sdk/cli/src/commands.rs `run`), and the `kiln run ...` line that builds it, quoted for a
// POSIX shell. Sizes, cores and durations parse as the CLI parses them (kiln_formats::units), so
// the line shown and the job submitted never disagree.

import type { JobSpec } from './types';
import { parseCpu, parseSize } from './units';

/** The form's fields, as typed: text where the CLI takes text (`--mem 4G`, `--cpu 0.5`). */
export interface SubmitForm {
  project: string;
  name: string;
  image: string;
  /** The command as one shell-like line, split by `splitCommand`. */
  command: string;
  cpu: string;
  mem: string;
  gpus: string;
  nodes: string;
  /** Empty for none (`--disk`, `--shm`, `--max-runtime` not given). */
  disk: string;
  shm: string;
  maxRuntime: string;
  datasets: string[];
  secrets: string[];
  /** `KEY=VALUE`, one a line; blank lines are skipped. */
  env: string;
  priority: 'low' | 'normal' | 'high';
  market: 'auto' | 'spot' | 'on-demand';
  pool: string;
}

/** The CLI's defaults: a flag left at its default is left out of the line. */
export const CLI_DEFAULTS = { cpu: '1', mem: '1G', gpus: '0', nodes: '1', priority: 'normal' } as const;

export function emptyForm(project = ''): SubmitForm {
  return {
    project, name: '', image: '', command: '', cpu: CLI_DEFAULTS.cpu, mem: CLI_DEFAULTS.mem, gpus: CLI_DEFAULTS.gpus,
    nodes: CLI_DEFAULTS.nodes, disk: '', shm: '', maxRuntime: '', datasets: [], secrets: [], env: '', priority: 'normal',
    market: 'auto', pool: '',
  };
}

export interface SubmitJobRequest {
  spec: JobSpec;
  idempotencyKey: string;
}

/** What is wrong with one field, in the CLI's words where it has some. */
export interface Problem {
  field: keyof SubmitForm;
  message: string;
}

/** The request and the line (and its words, quoted), or the problems that stop both. */
export type Built =
  | { ok: true; spec: JobSpec; argv: string[]; words: string[]; line: string }
  | { ok: false; problems: Problem[] };

// === units (cores and sizes: lib/units.ts) ===

/** A parse of lib/units.ts, its error as the problem's text. */
function parsed<T>(parse: (text: string) => T): (text: string) => T | string {
  return (text) => {
    try {
      return parse(text);
    } catch (error) {
      return (error as Error).message;
    }
  };
}
const cores = parsed(parseCpu);
const size = parsed(parseSize);

/** `90`, `90s`, `30m`, `2h`, `1d` to seconds (kiln_formats::units::parse_duration_secs). */
export function parseDuration(text: string): number | string {
  const found = /^(\d*)(.*)$/.exec(text.trim())!;
  const scale = ({ '': 1, s: 1, m: 60, h: 3600, d: 86_400 } as Record<string, number>)[found[2]];
  if (scale === undefined || found[1] === '') return `"${text}" is not a duration: use a number with s, m, h or d, such as 30m`;
  const value = Number(found[1]);
  if (value === 0) return 'a duration must be more than 0';
  return value * scale;
}

// === the command line ===

/**
 * Splits a line into argv as a POSIX shell splits words: blanks separate them, '…' keeps its
 * text as is, "…" too except that \ escapes $ ` " \ there, and \ outside quotes escapes any
 * character. Nothing else is interpreted: no $VARIABLES, globs, pipes or redirections (the
 * job runs argv without a shell; write `sh -c '…'` for one).
 */
export function splitCommand(line: string): string[] | string {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === ' ' || c === '\t' || c === '\n') {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
    } else if (c === "'") {
      const end = line.indexOf("'", i + 1);
      if (end < 0) return "the command has a ' without its closing '";
      word += line.slice(i + 1, end);
      inWord = true;
      i = end;
    } else if (c === '"') {
      let j = i + 1;
      for (; j < line.length && line[j] !== '"'; j++) {
        if (line[j] === '\\' && j + 1 < line.length && '$`"\\\n'.includes(line[j + 1])) {
          j++;
          if (line[j] !== '\n') word += line[j];
        } else {
          word += line[j];
        }
      }
      if (j >= line.length) return 'the command has a " without its closing "';
      inWord = true;
      i = j;
    } else if (c === '\\') {
      if (i + 1 >= line.length) return 'the command ends with a \\ that escapes nothing';
      i++;
      // A backslash-newline joins lines, as in a shell.
      if (line[i] !== '\n') {
        word += line[i];
        inWord = true;
      }
    } else {
      word += c;
      inWord = true;
    }
  }
  if (inWord) words.push(word);
  return words;
}

/** Characters a POSIX shell takes literally in a word (no quoting needed). */
const SHELL_SAFE = /^[A-Za-z0-9_@%+=:,./-]+$/;

/** One argument for a POSIX shell: as is when safe, else in single quotes ('\'' for a '). */
export function quote(arg: string): string {
  if (SHELL_SAFE.test(arg)) return arg;
  return `'${arg.replaceAll("'", `'\\''`)}'`;
}

// === the form ===

/** `KEY=VALUE` lines to pairs, in order (the CLI's parse_env: split at the first `=`). */
export function parseEnv(text: string): [string, string][] | string {
  const pairs: [string, string][] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const at = line.indexOf('=');
    if (at < 0) return `"${line}" is not KEY=VALUE`;
    pairs.push([line.slice(0, at), line.slice(at + 1)]);
  }
  return pairs;
}

/** A whole number in `min..=max`, as clap parses `--gpus` and `--nodes`. */
function parseCount(text: string, what: string, min: number, max: number): number | string {
  const trimmed = text.trim();
  const value = Number(trimmed);
  if (!/^\d+$/.test(trimmed) || value < min || value > max) return `${what} must be a whole number from ${min} to ${max}`;
  return value;
}

/** The request the CLI makes from the same flags (with --no-code: the UI uploads no code). */
export function buildSubmit(form: SubmitForm): Built {
  const problems: Problem[] = [];
  function check<T>(field: keyof SubmitForm, parsed: T | string): T | undefined {
    if (typeof parsed !== 'string') return parsed;
    problems.push({ field, message: parsed });
    return undefined;
  }
  const optional = <T>(field: keyof SubmitForm, text: string, parse: (text: string) => T | string) =>
    text.trim() === '' ? undefined : check(field, parse(text));

  if (!form.project) problems.push({ field: 'project', message: 'choose a project' });
  const argv = check('command', splitCommand(form.command));
  if (argv && argv.length === 0) problems.push({ field: 'command', message: 'give the command to run, such as python train.py' });
  const cpuMillis = check('cpu', cores(form.cpu));
  const memoryBytes = check('mem', size(form.mem));
  const gpus = check('gpus', parseCount(form.gpus, 'GPUs', 0, 4_294_967_295));
  const nodes = check('nodes', parseCount(form.nodes, 'nodes', 1, 64));
  const diskBytes = optional('disk', form.disk, size);
  const shmBytes = optional('shm', form.shm, size);
  const maxRuntimeSecs = optional('maxRuntime', form.maxRuntime, parseDuration);
  const env = check('env', parseEnv(form.env));
  if (problems.length > 0) return { ok: false, problems };

  const spec: JobSpec = {
    name: form.name.trim(),
    command: argv!,
    // The CLI collects --env into a map: a key given twice keeps its last value.
    env: Object.fromEntries(env!),
    resources: { cpuMillis: cpuMillis!, memoryBytes: memoryBytes!, diskBytes: diskBytes ?? 0, shmBytes: shmBytes ?? 0 },
    codeDigest: '',
    project: form.project,
    image: form.image.trim(),
    gpus: gpus!,
    maxRuntimeSecs: maxRuntimeSecs ?? 0,
    datasets: [...form.datasets],
    priorityClass: form.priority,
    market: form.market === 'spot' ? 'MARKET_SPOT' : form.market === 'on-demand' ? 'MARKET_ON_DEMAND' : 'MARKET_UNSPECIFIED',
    pool: form.pool.trim(),
    secrets: [...form.secrets],
    nodes: nodes!,
  };
  const words = commandWords(form, spec);
  return { ok: true, spec, argv: argv!, words, line: words.join(' ') };
}

/** The `kiln run` line of a checked form, each word quoted: flags at the CLI's defaults are left out. */
function commandWords(form: SubmitForm, spec: JobSpec): string[] {
  const words = ['kiln', 'run', '--no-code', '--project', spec.project];
  const flag = (name: string, value: string) => words.push(name, value);
  if (spec.name) flag('--name', spec.name);
  if (spec.image) flag('--image', spec.image);
  if (spec.resources!.cpuMillis !== 1000) flag('--cpu', form.cpu.trim());
  if (spec.resources!.memoryBytes !== 2 ** 30) flag('--mem', form.mem.trim());
  if (form.disk.trim()) flag('--disk', form.disk.trim());
  if (form.shm.trim()) flag('--shm', form.shm.trim());
  if (spec.gpus !== 0) flag('--gpus', String(spec.gpus));
  if (spec.nodes !== 1) flag('--nodes', String(spec.nodes));
  if (form.maxRuntime.trim()) flag('--max-runtime', form.maxRuntime.trim());
  for (const dataset of spec.datasets) flag('--dataset', dataset);
  for (const secret of spec.secrets) flag('--secret', secret);
  for (const [key, value] of parseEnv(form.env) as [string, string][]) flag('--env', `${key}=${value}`);
  if (spec.priorityClass !== CLI_DEFAULTS.priority) flag('--priority', spec.priorityClass);
  if (form.market === 'spot') words.push('--spot');
  if (form.market === 'on-demand') words.push('--on-demand');
  if (spec.pool) flag('--pool', spec.pool);
  return [...words, '--', ...spec.command].map(quote);
}

/**
 * A fresh idempotency key (32 hex characters). crypto.getRandomValues works on plain HTTP too,
 * where crypto.randomUUID does not.
 */
export function newIdempotencyKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}
