// Light and dark themes: the system's choice (prefers-color-scheme) unless the user picked one
// with the toggle, which is remembered in localStorage.

export type ThemeChoice = 'system' | 'light' | 'dark';

const KEY = 'kiln-theme';
const media = window.matchMedia('(prefers-color-scheme: dark)');

function stored(): ThemeChoice {
  const value = localStorage.getItem(KEY);
  return value === 'light' || value === 'dark' ? value : 'system';
}

export const theme = $state<{ choice: ThemeChoice; dark: boolean }>({ choice: stored(), dark: false });

function apply(): void {
  theme.dark = theme.choice === 'dark' || (theme.choice === 'system' && media.matches);
  document.documentElement.dataset.theme = theme.dark ? 'dark' : 'light';
}

export function startTheme(): void {
  apply();
  media.addEventListener('change', apply);
}

/** Cycles system -> the opposite of what shows -> the other -> system. */
export function toggleTheme(): void {
  const next: ThemeChoice = theme.choice === 'system' ? (theme.dark ? 'light' : 'dark') : theme.choice === 'dark' ? 'light' : 'system';
  theme.choice = next;
  if (next === 'system') localStorage.removeItem(KEY);
  else localStorage.setItem(KEY, next);
  apply();
}

/** Reads a theme colour (a CSS custom property) for canvas drawing, which cannot use var(). */
export function cssColor(name: string): string {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || '#888';
}
