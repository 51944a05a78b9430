import { describe, expect, it } from 'vitest';
import { buildSubmit, emptyForm, newIdempotencyKey, parseDuration, parseEnv, quote, splitCommand } from './submit';
import type { SubmitForm } from './submit';

function form(fields: Partial<SubmitForm>): SubmitForm {
  return { ...emptyForm('vision'), ...fields };
}

describe('parseDuration, as kiln_formats::units parses durations', () => {
  it('parses durations into seconds', () => {
    expect(parseDuration('90')).toBe(90);
    expect(parseDuration('30m')).toBe(1800);
    expect(parseDuration('2h')).toBe(7200);
    expect(parseDuration('1d')).toBe(86_400);
    expect(parseDuration('0s')).toMatch(/more than 0/);
    expect(parseDuration('soon')).toMatch(/not a duration/);
    expect(parseDuration('30 m')).toMatch(/not a duration/);
  });
});

describe('splitCommand', () => {
  it('splits on blanks and keeps quoted text whole', () => {
    expect(splitCommand('python train.py --lr 0.1')).toEqual(['python', 'train.py', '--lr', '0.1']);
    expect(splitCommand(`  sh -c 'echo "$HOME" > out' `)).toEqual(['sh', '-c', 'echo "$HOME" > out']);
    expect(splitCommand(`echo "it's \\"here\\" \\$x \\n"`)).toEqual(['echo', `it's "here" $x \\n`]);
    expect(splitCommand('a\\ b c\\\'d')).toEqual(['a b', "c'd"]);
    expect(splitCommand(`x''y "" ''`)).toEqual(['xy', '', '']);
    expect(splitCommand('a \\\nb')).toEqual(['a', 'b']);
  });
  it('interprets nothing else', () => {
    expect(splitCommand('echo $HOME *.py | wc > out')).toEqual(['echo', '$HOME', '*.py', '|', 'wc', '>', 'out']);
  });
  it('refuses an unclosed quote or a trailing backslash', () => {
    expect(splitCommand("echo 'a")).toMatch(/closing '/);
    expect(splitCommand('echo "a')).toMatch(/closing "/);
    expect(splitCommand('echo a\\')).toMatch(/escapes nothing/);
  });
});

describe('quote', () => {
  it('leaves safe words bare and single-quotes the rest', () => {
    expect(quote('train.py')).toBe('train.py');
    expect(quote('--lr=0.1')).toBe('--lr=0.1');
    expect(quote('')).toBe("''");
    expect(quote('a b')).toBe("'a b'");
    expect(quote("it's")).toBe(`'it'\\''s'`);
    expect(quote('$HOME')).toBe("'$HOME'");
    expect(quote('~/x')).toBe("'~/x'");
  });
  it('round-trips through splitCommand', () => {
    const argv = ['sh', '-c', `echo "it's" $X | tee 'out'`, '', 'a\\b', 'tab\there', 'new\nline', '*', '{a,b}'];
    expect(splitCommand(argv.map(quote).join(' '))).toEqual(argv);
  });
});

describe('parseEnv', () => {
  it('splits each line at its first =', () => {
    expect(parseEnv('A=1\n\nB=x=y\nC=')).toEqual([['A', '1'], ['B', 'x=y'], ['C', '']]);
    expect(parseEnv('oops')).toMatch(/not KEY=VALUE/);
  });
});

describe('buildSubmit', () => {
  it('builds what `kiln run --no-code` builds at the defaults', () => {
    const built = buildSubmit(form({ command: 'python train.py' }));
    expect(built.ok).toBe(true);
    if (!built.ok) return;
    expect(built.spec).toEqual({
      name: '', command: ['python', 'train.py'], env: {},
      resources: { cpuMillis: 1000, memoryBytes: 2 ** 30, diskBytes: 0, shmBytes: 0 },
      codeDigest: '', project: 'vision', image: '', gpus: 0, maxRuntimeSecs: 0, datasets: [],
      priorityClass: 'normal', market: 'MARKET_UNSPECIFIED', pool: '', secrets: [], nodes: 1,
    });
    expect(built.line).toBe('kiln run --no-code --project vision -- python train.py');
  });

  it('gives every flag its CLI name and quotes its value', () => {
    const built = buildSubmit(form({
      name: 'big run', image: 'ghcr.io/acme/train:1', command: `python -c 'print("hi")'`, cpu: '0.5', mem: '4G',
      gpus: '2', nodes: '4', disk: '20G', shm: '1G', maxRuntime: '2h', datasets: ['imagenet'], secrets: ['HF_TOKEN'],
      env: "A=1\nMSG=it's here", priority: 'high', market: 'spot', pool: 'gpu',
    }));
    expect(built.ok).toBe(true);
    if (!built.ok) return;
    expect(built.line).toBe(
      `kiln run --no-code --project vision --name 'big run' --image ghcr.io/acme/train:1 --cpu 0.5 --mem 4G --disk 20G ` +
        `--shm 1G --gpus 2 --nodes 4 --max-runtime 2h --dataset imagenet --secret HF_TOKEN --env A=1 ` +
        `--env 'MSG=it'\\''s here' --priority high --spot --pool gpu -- python -c 'print("hi")'`,
    );
    expect(built.spec).toMatchObject({
      name: 'big run', command: ['python', '-c', 'print("hi")'], env: { A: '1', MSG: "it's here" },
      resources: { cpuMillis: 500, memoryBytes: 4 * 2 ** 30, diskBytes: 20 * 2 ** 30, shmBytes: 2 ** 30 },
      gpus: 2, nodes: 4, maxRuntimeSecs: 7200, datasets: ['imagenet'], secrets: ['HF_TOKEN'],
      priorityClass: 'high', market: 'MARKET_SPOT', pool: 'gpu',
    });
    // The line, split as a shell splits it, gives back the command after `--`.
    const words = splitCommand(built.line) as string[];
    expect(words.slice(words.indexOf('--') + 1)).toEqual(built.spec.command);
  });

  it('asks on-demand with --on-demand and keeps the last value of a repeated key', () => {
    const built = buildSubmit(form({ command: 'x', market: 'on-demand', env: 'A=1\nA=2' }));
    expect(built.ok && built.spec.market).toBe('MARKET_ON_DEMAND');
    expect(built.ok && built.spec.env).toEqual({ A: '2' });
    expect(built.ok && built.line).toBe('kiln run --no-code --project vision --env A=1 --env A=2 --on-demand -- x');
  });

  it('names each field that is wrong', () => {
    const built = buildSubmit(form({ project: '', command: '', cpu: 'lots', mem: '4X', nodes: '0', disk: 'big', maxRuntime: '0', env: 'X' }));
    expect(built.ok).toBe(false);
    if (built.ok) return;
    expect(built.problems.map((problem) => problem.field)).toEqual(['project', 'command', 'cpu', 'mem', 'nodes', 'disk', 'maxRuntime', 'env']);
  });
});

describe('newIdempotencyKey', () => {
  it('makes distinct printable keys the API accepts', () => {
    const key = newIdempotencyKey();
    expect(key).toMatch(/^[0-9a-f]{32}$/);
    expect(newIdempotencyKey()).not.toBe(key);
  });
});
