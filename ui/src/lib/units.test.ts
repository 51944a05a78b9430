import { describe, expect, it } from 'vitest';
import { parseCount, parseCpu, parseSize, sizeText } from './units';

describe('parseCpu', () => {
  it('reads cores as millicores', () => {
    expect(parseCpu('2')).toBe(2000);
    expect(parseCpu(' 0.5 ')).toBe(500);
    expect(parseCpu('0.0015')).toBe(2);
  });
  it('refuses what is no number of cores', () => {
    expect(() => parseCpu('')).toThrow(/not a number of cores/);
    expect(() => parseCpu('two')).toThrow(/not a number of cores/);
    expect(() => parseCpu('-1')).toThrow(/not a number of cores/);
    // Number() reads these; the CLI's parser does not.
    expect(() => parseCpu('0x10')).toThrow(/not a number of cores/);
    expect(() => parseCpu('0b1')).toThrow(/not a number of cores/);
  });
  it('reads what the CLI reads', () => {
    expect(parseCpu('1e0')).toBe(1000);
    expect(parseCpu('2.')).toBe(2000);
    expect(parseCpu('.25')).toBe(250);
  });
});

describe('parseSize', () => {
  it('reads powers of 1024 as the CLI does', () => {
    expect(parseSize('100')).toBe(100);
    expect(parseSize('512M')).toBe(512 * 2 ** 20);
    expect(parseSize('4g')).toBe(4 * 2 ** 30);
    expect(parseSize('1.5GiB')).toBe(1.5 * 2 ** 30);
    expect(parseSize('2 KB')).toBe(2048);
    expect(parseSize('1Ti')).toBe(2 ** 40);
  });
  it('refuses an unknown unit', () => {
    expect(() => parseSize('4X')).toThrow(/such as 512M or 4G/);
    expect(() => parseSize('')).toThrow(/not a size/);
    expect(() => parseSize('-1G')).toThrow(/not a size/);
  });
});

describe('parseCount', () => {
  it('takes whole numbers only', () => {
    expect(parseCount('4', 'GPUs')).toBe(4);
    expect(() => parseCount('1.5', 'GPUs')).toThrow('GPUs must be a whole number');
  });
});

describe('sizeText', () => {
  it('writes bytes in the largest unit that keeps them exact', () => {
    expect(sizeText(4 * 2 ** 30)).toBe('4G');
    expect(sizeText(1536 * 2 ** 20)).toBe('1536M');
    expect(sizeText(100)).toBe('100');
    expect(sizeText(0)).toBe('0');
    expect(parseSize(sizeText(3 * 2 ** 40))).toBe(3 * 2 ** 40);
  });
});
