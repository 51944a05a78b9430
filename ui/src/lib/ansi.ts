// Colours of log lines: SGR escape sequences (`ESC[...m`) become styled segments; every other
// escape sequence (cursor moves, OSC titles) is dropped, so it never shows as garbage.

export interface AnsiStyle {
  /** 0-15 for the theme's palette (a CSS class), or an `rgb(...)` string for 256/true colours. */
  fg?: number | string;
  bg?: number | string;
  bold?: boolean;
  dim?: boolean;
  italic?: boolean;
  underline?: boolean;
}

export interface AnsiSegment extends AnsiStyle {
  text: string;
}

// CSI sequences (ESC [ params final), OSC sequences (ESC ] ... BEL or ESC \), and two-byte escapes.
// eslint-disable-next-line no-control-regex
const ESCAPE = /\x1b\[([0-9;:?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]/g;

/** The xterm 256-colour palette entry `n` (16-255) as an rgb() string. */
export function color256(n: number): string {
  if (n >= 232) {
    const level = 8 + (n - 232) * 10;
    return `rgb(${level},${level},${level})`;
  }
  const index = n - 16;
  const steps = [0, 95, 135, 175, 215, 255];
  const r = steps[Math.floor(index / 36) % 6];
  const g = steps[Math.floor(index / 6) % 6];
  const b = steps[index % 6];
  return `rgb(${r},${g},${b})`;
}

/** Reads an extended colour (`38;5;n` or `38;2;r;g;b`) starting at codes[i]; returns it and the codes used. */
function extended(codes: number[], i: number): [number | string | undefined, number] {
  if (codes[i + 1] === 5 && codes[i + 2] !== undefined) {
    const n = codes[i + 2];
    return [n < 16 ? n : color256(Math.min(n, 255)), 3];
  }
  if (codes[i + 1] === 2 && codes[i + 4] !== undefined) {
    return [`rgb(${codes[i + 2]},${codes[i + 3]},${codes[i + 4]})`, 5];
  }
  return [undefined, 1];
}

/** Applies one SGR sequence's codes to a style, returning the new style. */
export function applySgr(style: AnsiStyle, params: string): AnsiStyle {
  const codes = params === '' ? [0] : params.split(/[;:]/).map((p) => (p === '' ? 0 : Number(p)));
  let next: AnsiStyle = { ...style };
  for (let i = 0; i < codes.length; i++) {
    const code = codes[i];
    if (code === 0) next = {};
    else if (code === 1) next.bold = true;
    else if (code === 2) next.dim = true;
    else if (code === 3) next.italic = true;
    else if (code === 4) next.underline = true;
    else if (code === 22) { next.bold = false; next.dim = false; }
    else if (code === 23) next.italic = false;
    else if (code === 24) next.underline = false;
    else if (code >= 30 && code <= 37) next.fg = code - 30;
    else if (code >= 90 && code <= 97) next.fg = code - 90 + 8;
    else if (code >= 40 && code <= 47) next.bg = code - 40;
    else if (code >= 100 && code <= 107) next.bg = code - 100 + 8;
    else if (code === 39) delete next.fg;
    else if (code === 49) delete next.bg;
    else if (code === 38 || code === 48) {
      const [color, used] = extended(codes, i);
      if (color !== undefined) next[code === 38 ? 'fg' : 'bg'] = color;
      i += used - 1;
    }
  }
  return next;
}

function clean(style: AnsiStyle): AnsiStyle {
  const out: AnsiStyle = {};
  if (style.fg !== undefined) out.fg = style.fg;
  if (style.bg !== undefined) out.bg = style.bg;
  if (style.bold) out.bold = true;
  if (style.dim) out.dim = true;
  if (style.italic) out.italic = true;
  if (style.underline) out.underline = true;
  return out;
}

/** Splits a line into styled segments; `start` is the style carried over from earlier output. */
export function parseAnsi(line: string, start: AnsiStyle = {}): AnsiSegment[] {
  const segments: AnsiSegment[] = [];
  let style = start;
  let last = 0;
  ESCAPE.lastIndex = 0;
  for (let match = ESCAPE.exec(line); match; match = ESCAPE.exec(line)) {
    if (match.index > last) segments.push({ text: line.slice(last, match.index), ...clean(style) });
    if (match[2] === 'm') style = applySgr(style, match[1]);
    last = ESCAPE.lastIndex;
  }
  if (last < line.length) segments.push({ text: line.slice(last), ...clean(style) });
  return segments;
}

/** A line without its escape sequences (what the log search matches against). */
export function stripAnsi(line: string): string {
  return line.replace(ESCAPE, '');
}

/** The theme's classes of a segment (its palette colours, bold, dim, italic, underline). */
export function segmentClass(segment: AnsiSegment): string {
  const classes: string[] = [];
  if (typeof segment.fg === 'number') classes.push(`ansi-fg-${segment.fg}`);
  if (typeof segment.bg === 'number') classes.push(`ansi-bg-${segment.bg}`);
  if (segment.bold) classes.push('ansi-bold');
  if (segment.dim) classes.push('ansi-dim');
  if (segment.italic) classes.push('ansi-italic');
  if (segment.underline) classes.push('ansi-underline');
  return classes.join(' ');
}

/** The inline style of a segment's 256 and true colours (the palette's are classes). */
export function segmentStyle(segment: AnsiSegment): string {
  let css = '';
  if (typeof segment.fg === 'string') css += `color:${segment.fg};`;
  if (typeof segment.bg === 'string') css += `background:${segment.bg};`;
  return css;
}
