// Window arithmetic of the virtualised lists (the Runs table, the log view): rows have one
// fixed height, so which rows are visible is a division, and only those (plus a few above and
// below, so fast scrolling shows no blank edge) are in the DOM.

export interface VirtualWindow {
  /** First rendered row (inclusive) and last (exclusive). */
  start: number;
  end: number;
  /** Space above the first rendered row and below the last, in pixels. */
  padTop: number;
  padBottom: number;
  /** Height of every row together. */
  total: number;
}

export function virtualWindow(
  count: number,
  rowHeight: number,
  scrollTop: number,
  viewportHeight: number,
  overscan = 8,
): VirtualWindow {
  const total = count * rowHeight;
  if (count === 0 || rowHeight <= 0) return { start: 0, end: 0, padTop: 0, padBottom: 0, total: 0 };
  const top = Math.max(0, Math.min(scrollTop, Math.max(0, total - viewportHeight)));
  const firstVisible = Math.floor(top / rowHeight);
  const lastVisible = Math.ceil((top + Math.max(0, viewportHeight)) / rowHeight);
  const start = Math.max(0, firstVisible - overscan);
  const end = Math.min(count, lastVisible + overscan);
  return { start, end, padTop: start * rowHeight, padBottom: (count - end) * rowHeight, total };
}

/** The scrollTop that brings row `index` into view, or undefined when it already is. */
export function scrollToRow(index: number, rowHeight: number, scrollTop: number, viewportHeight: number): number | undefined {
  const top = index * rowHeight;
  if (top < scrollTop) return top;
  if (top + rowHeight > scrollTop + viewportHeight) return top + rowHeight - viewportHeight;
  return undefined;
}

/** Whether a scroll position is at the bottom (within a row), where following new lines continues. */
export function atBottom(scrollTop: number, viewportHeight: number, scrollHeight: number, slack: number): boolean {
  return scrollTop + viewportHeight >= scrollHeight - slack;
}
