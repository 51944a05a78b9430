import { describe, expect, it } from 'vitest';
import { atBottom, scrollToRow, virtualWindow } from './virtual';

describe('virtualWindow', () => {
  it('renders the visible rows plus overscan at the top', () => {
    expect(virtualWindow(10_000, 30, 0, 600, 5)).toEqual({ start: 0, end: 25, padTop: 0, padBottom: 9975 * 30, total: 300_000 });
  });

  it('renders a window in the middle', () => {
    const w = virtualWindow(10_000, 30, 3000, 600, 5);
    expect([w.start, w.end]).toEqual([95, 125]);
    expect(w.padTop + (w.end - w.start) * 30 + w.padBottom).toBe(w.total);
  });

  it('clamps a scroll past the end (the list shrank under it)', () => {
    const w = virtualWindow(100, 30, 1_000_000, 600, 2);
    expect([w.start, w.end]).toEqual([78, 100]);
    expect(w.padBottom).toBe(0);
  });

  it('handles an empty list', () => {
    expect(virtualWindow(0, 30, 50, 600)).toEqual({ start: 0, end: 0, padTop: 0, padBottom: 0, total: 0 });
  });
});

describe('scrollToRow', () => {
  it('scrolls up or down only as far as needed', () => {
    expect(scrollToRow(2, 30, 300, 600)).toBe(60);
    expect(scrollToRow(40, 30, 300, 600)).toBe(40 * 30 + 30 - 600);
    expect(scrollToRow(15, 30, 300, 600)).toBeUndefined();
  });
});

describe('atBottom', () => {
  it('is true within the slack of the end', () => {
    expect(atBottom(380, 600, 1000, 20)).toBe(true);
    expect(atBottom(300, 600, 1000, 20)).toBe(false);
  });
});
