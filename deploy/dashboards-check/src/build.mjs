// Builders of kiln's Grafana dashboards: a dashboard is a list of sections, a section a row title
// and its panels, laid out two (or more) abreast. `npm run generate` writes the JSON files from
// these definitions; `npm run check` fails when the committed JSON differs from them.

/** The datasource provisioned by deploy/compose/grafana/provisioning/datasources/prometheus.yml. */
export const DS = { type: 'prometheus', uid: 'prometheus' };

/** A query: `expr` with `legend` as its legend format. */
export const q = (expr, legend = '') => ({ expr, legend });

/** The `pool` and `project` variables, from label values of metrics every kiln stack exports. */
export function variables() {
  const variable = (name, label, query, description) => ({
    name,
    label,
    description,
    type: 'query',
    datasource: DS,
    query,
    refresh: 2,
    includeAll: true,
    multi: true,
    allValue: '.*',
    current: { selected: true, text: ['All'], value: ['$__all'] },
    sort: 1,
    hide: 0,
    options: [],
    regex: '',
    skipUrlSync: false,
  });
  return [
    variable(
      'pool',
      'Pool',
      'label_values(kiln_scheduler_capacity, pool)',
      'Runner pools, as their runners report capacity to the scheduler',
    ),
    variable(
      'project',
      'Project',
      'label_values(kiln_api_jobs_submitted_total, project)',
      'Projects that submitted jobs',
    ),
  ];
}

/** A panel of `type`; `opts` may set unit, width (of 24), height, stack, min, max, decimals. */
export function panel(type, title, description, queries, opts = {}) {
  const targets = queries.map((query, i) => {
    const target = {
      refId: String.fromCharCode(65 + i),
      datasource: DS,
      expr: query.expr,
      legendFormat: query.legend || '__auto',
      editorMode: 'code',
      range: type !== 'stat',
      instant: type === 'stat',
    };
    if (type === 'heatmap') target.format = 'heatmap';
    return target;
  });
  const defaults = {};
  if (opts.unit) defaults.unit = opts.unit;
  if (opts.min !== undefined) defaults.min = opts.min;
  if (opts.max !== undefined) defaults.max = opts.max;
  if (opts.decimals !== undefined) defaults.decimals = opts.decimals;
  if (type === 'timeseries') {
    defaults.custom = {
      drawStyle: 'line',
      lineWidth: 1,
      fillOpacity: opts.stack ? 30 : 10,
      showPoints: 'never',
      stacking: { mode: opts.stack ? 'normal' : 'none', group: 'A' },
    };
  }
  const options = {
    timeseries: { legend: { displayMode: 'list', placement: 'bottom', showLegend: true }, tooltip: { mode: 'multi', sort: 'desc' } },
    stat: { reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false }, colorMode: 'value', graphMode: 'area', textMode: 'auto' },
    heatmap: { calculate: false, yAxis: { unit: opts.unit || 's' }, cellGap: 1, tooltip: { mode: 'single', yHistogram: true } },
    bargauge: { reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false }, displayMode: 'gradient', orientation: 'horizontal' },
  }[type];
  return {
    type,
    title,
    description,
    datasource: DS,
    fieldConfig: { defaults, overrides: [] },
    options,
    targets,
    width: opts.width || 12,
    height: opts.height || 8,
  };
}

export const timeseries = (...args) => panel('timeseries', ...args);
export const stat = (title, description, queries, opts = {}) =>
  panel('stat', title, description, queries, { width: 6, height: 4, ...opts });
export const heatmap = (...args) => panel('heatmap', ...args);

/**
 * p50/p95/p99 of a histogram's `_bucket` series, by `by` (a label list, may be empty); with
 * `orZero`, each reads 0 while the histogram has no series yet (a labelled family appears with
 * its first observation).
 */
export function quantiles(bucket, selector = '', by = '', orZero = false) {
  const labels = by ? `le, ${by}` : 'le';
  const legend = by ? by.split(',').map((l) => `{{${l.trim()}}}`).join(' ') + ' ' : '';
  return [0.5, 0.95, 0.99].map((p) =>
    q(
      `histogram_quantile(${p}, sum by (${labels}) (rate(${bucket}${selector}[$__rate_interval])))${orZero ? ' or vector(0)' : ''}`,
      `${legend}p${Math.round(p * 100)}`,
    ),
  );
}

/** A whole dashboard: `sections` is a list of [row title, panels]. */
export function dashboard({ uid, title, description, sections }) {
  const panels = [];
  let id = 1;
  let y = 0;
  for (const [rowTitle, rowPanels] of sections) {
    panels.push({ type: 'row', id: id++, title: rowTitle, collapsed: false, panels: [], gridPos: { h: 1, w: 24, x: 0, y } });
    y += 1;
    let x = 0;
    let rowHeight = 0;
    for (const { width, height, ...p } of rowPanels) {
      if (x + width > 24) {
        x = 0;
        y += rowHeight;
        rowHeight = 0;
      }
      panels.push({ id: id++, ...p, gridPos: { h: height, w: width, x, y } });
      x += width;
      rowHeight = Math.max(rowHeight, height);
    }
    y += rowHeight;
  }
  return {
    uid,
    title,
    description,
    tags: ['kiln'],
    editable: true,
    graphTooltip: 1,
    schemaVersion: 42,
    version: 1,
    time: { from: 'now-1h', to: 'now' },
    refresh: '30s',
    timezone: 'browser',
    fiscalYearStartMonth: 0,
    liveNow: false,
    timepicker: {},
    links: [
      {
        title: 'kiln',
        type: 'dashboards',
        tags: ['kiln'],
        asDropdown: true,
        icon: 'external link',
        includeVars: true,
        keepTime: true,
        targetBlank: false,
        tooltip: 'The other kiln dashboards',
      },
    ],
    annotations: { list: [] },
    templating: { list: variables() },
    panels,
  };
}
