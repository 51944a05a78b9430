import { describe, expect, it } from 'vitest';
import { color256, parseAnsi, segmentClass, segmentStyle, stripAnsi } from './ansi';

describe('parseAnsi', () => {
  it('leaves plain text as one segment', () => {
    expect(parseAnsi('hello')).toEqual([{ text: 'hello' }]);
  });

  it('colours and resets', () => {
    expect(parseAnsi('a\x1b[31mred\x1b[0m b')).toEqual([
      { text: 'a' },
      { text: 'red', fg: 1 },
      { text: ' b' },
    ]);
  });

  it('combines bold with a bright colour and a background', () => {
    expect(parseAnsi('\x1b[1;92;44mok')).toEqual([{ text: 'ok', fg: 10, bg: 4, bold: true }]);
  });

  it('reads 256 and true colours', () => {
    expect(parseAnsi('\x1b[38;5;196mx\x1b[48;2;1;2;3my')).toEqual([
      { text: 'x', fg: color256(196) },
      { text: 'y', fg: color256(196), bg: 'rgb(1,2,3)' },
    ]);
    expect(color256(196)).toBe('rgb(255,0,0)');
    expect(color256(232)).toBe('rgb(8,8,8)');
  });

  it('drops non-SGR sequences and resets a colour with 39', () => {
    expect(parseAnsi('\x1b[2K\x1b[33mwarn\x1b[39m\x1b]0;title\x07 end')).toEqual([
      { text: 'warn', fg: 3 },
      { text: ' end' },
    ]);
  });

  it('carries a style across lines', () => {
    expect(parseAnsi('still', { fg: 2 })).toEqual([{ text: 'still', fg: 2 }]);
  });

  it('strips escapes for search', () => {
    expect(stripAnsi('\x1b[1mloss\x1b[0m=0.5')).toBe('loss=0.5');
  });
});

describe('segmentClass and segmentStyle', () => {
  it('give palette colours and attributes as classes, other colours inline', () => {
    const [segment] = parseAnsi('\x1b[1;4;31;48;5;196mx');
    expect(segmentClass(segment)).toBe('ansi-fg-1 ansi-bold ansi-underline');
    expect(segmentStyle(segment)).toBe(`background:${color256(196)};`);
    expect(segmentClass({ text: 'plain' })).toBe('');
    expect(segmentStyle({ text: 'plain' })).toBe('');
  });
});
