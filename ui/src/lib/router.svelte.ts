// Client-side routing with the History API. The server answers index.html for any path it does
// not know, so every route here can be loaded directly. Links are plain <a href>: a document
// click handler turns same-origin clicks into pushState (modifier clicks open tabs as usual).

export interface Route {
  /** The page's name. */
  page: 'login' | 'runs' | 'run' | 'compare' | 'batches' | 'batch' | 'sweeps' | 'sweep' | 'services' | 'models' | 'admin' | 'projects' | 'project' | 'submit' | 'notfound';
  /** The path parameter (`/runs/:id`), when the route has one. */
  id: string;
  query: URLSearchParams;
}

const PATTERNS: [RegExp, Route['page']][] = [
  [/^\/$/, 'runs'],
  [/^\/login$/, 'login'],
  [/^\/runs\/([^/]+)$/, 'run'],
  [/^\/compare$/, 'compare'],
  [/^\/batches$/, 'batches'],
  [/^\/batches\/([^/]+)$/, 'batch'],
  [/^\/sweeps$/, 'sweeps'],
  [/^\/sweeps\/([^/]+)$/, 'sweep'],
  [/^\/services$/, 'services'],
  [/^\/models$/, 'models'],
  [/^\/admin$/, 'admin'],
  [/^\/submit$/, 'submit'],
  [/^\/projects$/, 'projects'],
  [/^\/projects\/([^/]+)$/, 'project'],
];

export function match(pathname: string, search: string): Route {
  const query = new URLSearchParams(search);
  for (const [pattern, page] of PATTERNS) {
    const found = pattern.exec(pathname);
    if (found) return { page, id: found[1] ? decodeURIComponent(found[1]) : '', query };
  }
  return { page: 'notfound', id: '', query };
}

export const router = $state({ route: match(location.pathname, location.search) });

export function navigate(href: string, replace = false): void {
  const url = new URL(href, location.href);
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  router.route = match(url.pathname, url.search);
  if (!replace) window.scrollTo(0, 0);
}

/** Installs the popstate and link-click handlers; call once at start. */
export function startRouter(): void {
  window.addEventListener('popstate', () => {
    router.route = match(location.pathname, location.search);
  });
  document.addEventListener('click', (event) => {
    if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    const anchor = (event.target as Element | null)?.closest?.('a');
    if (!anchor || anchor.target || anchor.hasAttribute('download')) return;
    const url = new URL(anchor.href, location.href);
    if (url.origin !== location.origin || url.pathname.startsWith('/api/')) return;
    event.preventDefault();
    navigate(url.pathname + url.search + url.hash);
  });
}
