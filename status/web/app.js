// The status page: charts the process's history (history.json, the last
// minutes), then polls status.json and draws what the process does.
// Counters come as totals; rates are taken between successive samples.
'use strict';

(function () {
  const POLL_MS = 1000;
  const KEEP = 600; // samples charted: 10 minutes at one a second
  const HEIGHT = 200;
  const COLORS = ['#2f7ed8', '#e8742a', '#3aa757', '#a05fd0', '#d64550', '#8c8c8c'];

  // Formatting.
  const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function bytes(n) {
    if (n == null || isNaN(n)) return '–';
    let i = 0;
    let v = Math.abs(n);
    while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
    const s = i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0);
    return (n < 0 ? '-' : '') + s + ' ' + UNITS[i];
  }
  function count(n) {
    if (n == null || isNaN(n)) return '–';
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (n / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (n / 1e3).toFixed(1) + 'k';
    return Number.isInteger(n) ? String(n) : n.toFixed(a < 10 ? 2 : 1);
  }
  const perSec = (f) => (n) => (n == null ? '–' : f(n) + '/s');
  function pct(r) { return r == null || isNaN(r) ? '–' : (100 * r).toFixed(1) + '%'; }
  // ago says how long before a sample's time (the process's clock, not
  // the browser's) something happened.
  function ago(sample, ms) {
    const s = Math.max(0, Math.round((sample.time - ms) / 1000));
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    return Math.floor(s / 3600) + ' h ago';
  }
  function duration(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    if (d) return d + 'd ' + h + 'h';
    if (h) return h + 'h ' + m + 'm';
    if (m) return m + 'm ' + (s % 60) + 's';
    return s + 's';
  }

  // rate is the per-second change of get between samples p and c; null
  // without a previous sample, 0 across a restart's reset counter.
  function rate(p, c, get) {
    if (!p) return null;
    const dt = (c.time - p.time) / 1000;
    if (dt <= 0) return null;
    return Math.max(0, get(c) - get(p)) / dt;
  }
  function ratio(a, b) { return b > 0 ? a / b : null; }
  // now says a byte rate, once there is one.
  function now(r) { return r == null ? '' : 'now ' + perSec(bytes)(r); }

  // release is the release a read-only copy holds, or how many of a
  // read-write volume there were; sites, where its copies are.
  function release(v) {
    if (v.read_only) return v.release ? String(v.release) : 'none yet';
    return v.released ? v.released + ' made' : '';
  }
  function sites(v) {
    const out = (v.sites || []).concat((v.pending || []).map((p) => p + ' (pending)'));
    return out.join(', ') || (v.rw ? 'none' : '');
  }

  // The views: what each kind of process shows. A card is a number now
  // (value: raw, fmt: as shown, sub: a line under it); a chart is series
  // over time (v(prev, cur) per sample); a table lists rows of a sample.
  const C = (s) => s.client, S = (s) => s.server, P = (s) => s.proxy;
  // Charts start at 0; a flat 0 shows a scale of 0 to 1 (1 KiB for bytes).
  const fromZero = (floor) => (u, min, max) => [0, max > 0 ? max * 1.1 : floor];

  const serverCards = [
    { id: 'sessions', label: 'Clients connected', value: (s) => S(s).sessions, fmt: count },
    { id: 'rpc-rate', label: 'Requests', value: (s, p) => rate(p, s, (x) => S(x).rpcs), fmt: perSec(count),
      sub: (s) => count(S(s).rpcs) + ' handled' },
    { id: 'promises', label: 'Promises held', value: (s) => S(s).promises, fmt: count,
      sub: (s) => S(s).delegations + ' delegations' },
    { id: 'server-breaks', label: 'Promises broken', value: (s) => S(s).breaks, fmt: count,
      sub: (s) => S(s).recalls + ' recalls, ' + S(s).revokes + ' revokes, ' + S(s).resets + ' resets' },
  ];
  const serverCharts = [
    { id: 'sessions', title: 'Clients connected', fmt: count, series: [
      { label: 'sessions', v: (p, c) => S(c).sessions }] },
    { id: 'rpcs', title: 'Requests per second', fmt: perSec(count), series: [
      { label: 'handled', v: (p, c) => rate(p, c, (x) => S(x).rpcs) }] },
    { id: 'held', title: 'Promises and delegations held by clients', fmt: count, series: [
      { label: 'promises', v: (p, c) => S(c).promises },
      { label: 'delegations', v: (p, c) => S(c).delegations }] },
    { id: 'server-breaks', title: 'Breaks, recalls and revokes per second', fmt: perSec(count), series: [
      { label: 'breaks', v: (p, c) => rate(p, c, (x) => S(x).breaks) },
      { label: 'recalls', v: (p, c) => rate(p, c, (x) => S(x).recalls) },
      { label: 'revokes', v: (p, c) => rate(p, c, (x) => S(x).revokes) }] },
  ];

  const views = {
    mount: {
      cards: [
        { id: 'cache-bytes', label: 'Cache held', value: (s) => C(s).cache_bytes, fmt: bytes,
          sub: (s) => 'of ' + bytes(C(s).cache_limit) + ' (' + pct(ratio(C(s).cache_bytes, C(s).cache_limit)) + '), ' + count(C(s).cache_files) + ' files' },
        { id: 'hit-ratio', label: 'Hit ratio', value: (s) => ratio(C(s).hits, C(s).hits + C(s).misses), fmt: pct,
          sub: (s) => count(C(s).hits) + ' reads from cache, ' + count(C(s).misses) + ' fetched' },
        { id: 'fetched-bytes', label: 'Fetched from servers', value: (s) => C(s).fetched_bytes, fmt: bytes,
          sub: (s, p) => now(rate(p, s, (x) => C(x).fetched_bytes)) },
        { id: 'dirty-bytes', label: 'Dirty, waiting to store', value: (s) => C(s).dirty_bytes, fmt: bytes,
          sub: (s) => bytes(C(s).flushed_bytes) + ' stored in the background' },
        { id: 'delegations', label: 'Delegations held', value: (s) => C(s).read_delegations + C(s).write_delegations, fmt: count,
          sub: (s) => C(s).read_delegations + ' read, ' + C(s).write_delegations + ' write; ' + C(s).promises + ' promises' },
        { id: 'breaks', label: 'Callback breaks', value: (s) => C(s).breaks, fmt: count,
          sub: (s) => C(s).recalls + ' recalls, ' + C(s).resets + ' resets' },
      ],
      charts: [
        { id: 'cache', title: 'Cache use', fmt: bytes, bytes: true, series: [
          { label: 'held', v: (p, c) => C(c).cache_bytes, fill: true },
          { label: 'limit', v: (p, c) => C(c).cache_limit, dash: true }] },
        { id: 'throughput', title: 'Throughput', fmt: perSec(bytes), bytes: true, series: [
          { label: 'fetched', v: (p, c) => rate(p, c, (x) => C(x).fetched_bytes) },
          { label: 'stored by write-back', v: (p, c) => rate(p, c, (x) => C(x).flushed_bytes) }] },
        { id: 'reads', title: 'Reads per second', fmt: perSec(count), series: [
          { label: 'from cache', v: (p, c) => rate(p, c, (x) => C(x).hits) },
          { label: 'fetched', v: (p, c) => rate(p, c, (x) => C(x).misses) }] },
        { id: 'hit-ratio', title: 'Hit ratio', fmt: pct, range: () => [0, 1], series: [
          // No reads, no ratio: points, joined across the gaps.
          { label: 'hits / reads', points: true, v: (p, c) => (p ? ratio(C(c).hits - C(p).hits, C(c).hits - C(p).hits + C(c).misses - C(p).misses) : null) }] },
        { id: 'dirty', title: 'Dirty data waiting (write-back queue)', fmt: bytes, bytes: true, series: [
          { label: 'dirty', v: (p, c) => C(c).dirty_bytes, fill: true }] },
        { id: 'held', title: 'Delegations and promises held', fmt: count, series: [
          { label: 'read delegations', v: (p, c) => C(c).read_delegations },
          { label: 'write delegations', v: (p, c) => C(c).write_delegations },
          { label: 'promises', v: (p, c) => C(c).promises }] },
        { id: 'breaks', title: 'Callback breaks per second', fmt: perSec(count), series: [
          { label: 'files broken', v: (p, c) => rate(p, c, (x) => C(x).breaks) },
          { label: 'recalls', v: (p, c) => rate(p, c, (x) => C(x).recalls) },
          { label: 'resets', v: (p, c) => rate(p, c, (x) => C(x).resets) }] },
      ],
      tables: [
        { id: 'largest', title: 'Files holding the most cache', empty: 'nothing cached',
          cols: [{ label: 'file', cls: 'path' }, { label: 'cached', cls: 'num' }, { label: 'dirty', cls: 'num' }],
          rows: (s) => C(s).largest.map((f) => [f.path || 'fid ' + f.fid, bytes(f.bytes), f.dirty ? bytes(f.dirty) : '']) },
        { id: 'broken', title: 'Last files invalidated (breaks; a reset voids all)', empty: 'none since the start',
          cols: [{ label: 'file', cls: 'path' }, { label: 'when', cls: 'num' }],
          rows: (s) => C(s).broken.map((b) => [b.path || 'fid ' + b.fid, ago(s, b.time)]) },
      ],
    },
    server: {
      cards: serverCards.concat([
        { id: 'volumes', label: 'Volumes', value: (s) => (S(s).volumes || []).length, fmt: count,
          sub: (s) => (S(s).volumes || []).map((v) => v.name).slice(0, 4).join(', ') },
        // Without its lease a server changes no location, and the cell
        // may take it for dead.
        { id: 'lease', label: 'Location database', value: (s) => !S(s).cell ? 'no cell' : S(s).cell.lease ? 'lease held' : 'LEASE LOST',
          fmt: (v) => v, sub: (s) => S(s).cell ? 'server ' + S(s).cell.name : '' },
        { id: 'disk', label: 'Disk free', value: (s) => S(s).cell ? S(s).cell.disk_free : null, fmt: bytes,
          sub: (s) => S(s).cell ? 'of ' + bytes(S(s).cell.disk_size) : '' },
      ]),
      charts: serverCharts,
      tables: [
        { id: 'volumes', title: 'Volumes', empty: 'none',
          cols: [{ label: 'name', cls: 'path' }, { label: 'kind' }, { label: 'release', cls: 'num' }, { label: 'read-only sites' },
            { label: 'id', cls: 'num' }, { label: 'used', cls: 'num' }, { label: 'quota', cls: 'num' }, { label: 'files', cls: 'num' }],
          rows: (s) => (S(s).volumes || []).map((v) => [v.name, v.read_only ? 'read-only copy' : 'read-write',
            release(v), sites(v), String(v.id), bytes(v.used), v.quota ? bytes(v.quota) : 'none', count(v.files)]) },
        { id: 'moves', title: 'Moves and releases in progress', empty: 'none',
          cols: [{ label: 'volume', cls: 'path' }, { label: 'kind' }, { label: 'phase' }, { label: 'phase began', cls: 'num' }, { label: 'with' }],
          rows: (s) => (S(s).moves || []).map((m) => [m.volume, m.kind, m.phase, m.since ? ago(s, m.since) : '',
            (m.phase === 'receiving' ? 'from ' : 'to ') + m.peers.join(', ')]) },
      ],
    },
    proxy: {
      cards: [
        { id: 'served-bytes', label: 'Served to clients', value: (s) => P(s).served_bytes, fmt: bytes,
          sub: (s, p) => now(rate(p, s, (x) => P(x).served_bytes)) },
        { id: 'origin-bytes', label: 'Fetched from origin', value: (s) => P(s).fetched_bytes, fmt: bytes,
          sub: (s, p) => [P(s).origin, now(rate(p, s, (x) => P(x).fetched_bytes))].filter(Boolean).join(', ') },
        { id: 'proxy-hit-ratio', label: 'Hit ratio', value: (s) => ratio(P(s).hits, P(s).hits + P(s).misses), fmt: pct,
          sub: (s) => count(P(s).hits) + ' chunks from the store, ' + count(P(s).misses) + ' from the origin' },
        { id: 'store-bytes', label: 'Store held', value: (s) => P(s).store_bytes, fmt: bytes,
          sub: (s) => 'of ' + bytes(P(s).store_limit) + ', ' + count(P(s).store_files) + ' files' },
      ].concat(serverCards),
      charts: [
        { id: 'proxy-bytes', title: 'Served vs fetched from origin', fmt: perSec(bytes), bytes: true, series: [
          { label: 'served', v: (p, c) => rate(p, c, (x) => P(x).served_bytes) },
          { label: 'from origin', v: (p, c) => rate(p, c, (x) => P(x).fetched_bytes) }] },
        { id: 'store', title: 'Store use', fmt: bytes, bytes: true, series: [
          { label: 'held', v: (p, c) => P(c).store_bytes, fill: true },
          { label: 'limit', v: (p, c) => P(c).store_limit, dash: true }] },
      ].concat(serverCharts),
      tables: [],
    },
  };

  // DOM helpers: text only, never markup (paths are anyone's names).
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  let view = null;
  const cards = {}, charts = {}, tables = {};
  let prev = null;

  function build(kind) {
    view = views[kind];
    const cardBox = document.getElementById('cards');
    for (const c of view.cards) {
      const box = el('div', 'card');
      box.id = 'card-' + c.id;
      box.append(el('div', 'label', c.label));
      const v = el('div', 'value', '–');
      v.id = 'v-' + c.id;
      const sub = el('div', 'sub', '');
      box.append(v, sub);
      cardBox.append(box);
      cards[c.id] = { spec: c, value: v, sub: sub };
    }
    const chartBox = document.getElementById('charts');
    for (const spec of view.charts) {
      const box = el('div', 'chart');
      box.id = 'chart-' + spec.id;
      box.append(el('h2', null, spec.title));
      const plot = el('div', 'plot');
      box.append(plot);
      chartBox.append(box);
      const data = [[]].concat(spec.series.map(() => []));
      const u = new uPlot(chartOpts(spec, plot), data, plot);
      charts[spec.id] = { spec: spec, u: u, data: data, plot: plot, box: box };
    }
    const tableBox = document.getElementById('tables');
    for (const spec of view.tables) {
      const box = el('div', 'table');
      box.id = 'table-' + spec.id;
      box.append(el('h2', null, spec.title));
      const t = el('table');
      const head = el('tr');
      for (const col of spec.cols) head.append(el('th', col.cls, col.label));
      t.append(el('thead'), el('tbody'));
      t.tHead.append(head);
      box.append(t);
      tableBox.append(box);
      tables[spec.id] = { spec: spec, body: t.tBodies[0] };
    }
    if (window.ResizeObserver) {
      const ro = new ResizeObserver(() => {
        for (const id in charts) {
          const c = charts[id];
          c.u.setSize({ width: plotWidth(c.plot), height: HEIGHT });
        }
      });
      for (const id in charts) ro.observe(charts[id].plot);
    }
  }

  function plotWidth(plot) { return Math.max(200, plot.clientWidth || 400); }

  // lastMinute ranges the time axis over the samples, and at least the
  // minute up to the last: the first few do not stretch across the chart
  // (nor one sample across uPlot's default of a thousand days).
  function lastMinute(u, min, max) {
    const xs = u.data[0];
    if (!xs || xs.length === 0) return [min, max];
    const last = xs[xs.length - 1];
    return [Math.min(xs[0], last - 60), last];
  }

  function chartOpts(spec, plot) {
    const css = getComputedStyle(document.documentElement);
    const fg = css.getPropertyValue('--muted').trim() || '#666';
    const grid = css.getPropertyValue('--line').trim() || '#ddd';
    const axis = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    return {
      width: plotWidth(plot),
      height: HEIGHT,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true, range: lastMinute }, y: { range: spec.range || fromZero(spec.bytes ? 1024 : 1) } },
      axes: [axis, Object.assign({}, axis, {
        values: (u, vals) => vals.map(spec.fmt),
        // Wide enough for the longest label (about 7 px a character).
        size: (u, vals) => 20 + 7 * Math.max(4, ...(vals || []).map((v) => String(v).length)),
      })],
      series: [{}].concat(spec.series.map((s, i) => ({
        label: s.label,
        stroke: COLORS[i % COLORS.length],
        width: 2,
        dash: s.dash ? [6, 4] : undefined,
        fill: s.fill ? COLORS[i % COLORS.length] + '22' : undefined,
        spanGaps: !!s.points,
        points: s.points ? { show: true, size: 5 } : undefined,
        value: (u, v) => spec.fmt(v),
      }))),
    };
  }

  // begin builds the page for s's kind, the first time.
  function begin(s) {
    if (view) return;
    document.getElementById('kind').textContent = 'hoard ' + s.kind;
    document.getElementById('name').textContent = s.name;
    document.title = 'hoard ' + s.kind + ' ' + s.name;
    build(s.kind);
  }

  // plot adds sample s to the charts, its rates taken since the last
  // charted, unless it is no later than that one.
  function plot(s) {
    if (prev && s.time <= prev.time) return;
    for (const id in charts) {
      const c = charts[id];
      c.data[0].push(s.time / 1000);
      c.spec.series.forEach((ser, i) => {
        const v = ser.v(prev, s);
        c.data[i + 1].push(v == null || isNaN(v) ? null : v);
      });
      if (c.data[0].length > KEEP) for (const a of c.data) a.splice(0, a.length - KEEP);
    }
    prev = s;
  }

  // redraw draws the charts, and marks on each the time it starts at and
  // the largest value it shows.
  function redraw() {
    for (const id in charts) {
      const c = charts[id];
      c.u.setData(c.data);
      let peak = 0;
      for (const a of c.data.slice(1)) for (const v of a) if (v > peak) peak = v;
      c.box.dataset.first = String(c.data[0][0] ?? '');
      c.box.dataset.peak = String(peak);
    }
  }

  function update(s) {
    begin(s);
    document.getElementById('meta').textContent = 'pid ' + s.pid + ', up ' + duration(s.uptime);
    for (const id in cards) {
      const c = cards[id];
      const v = c.spec.value(s, prev);
      c.value.textContent = c.spec.fmt(v);
      c.value.dataset.value = v == null ? '' : String(v);
      if (c.spec.sub) c.sub.textContent = c.spec.sub(s, prev);
    }
    plot(s);
    redraw();
    for (const id in tables) {
      const t = tables[id];
      const rows = t.spec.rows(s);
      const body = el('tbody');
      if (rows.length === 0) {
        const td = el('td', 'empty', t.spec.empty);
        td.colSpan = t.spec.cols.length;
        const tr = el('tr');
        tr.append(td);
        body.append(tr);
      }
      for (const r of rows) {
        const tr = el('tr');
        r.forEach((cell, i) => tr.append(el('td', t.spec.cols[i].cls, cell)));
        body.append(tr);
      }
      t.body.replaceWith(body);
      t.body = body;
    }
    document.body.dataset.samples = String((Number(document.body.dataset.samples) || 0) + 1);
  }

  // history charts the samples the process kept before the page opened
  // (brief: what the charts need), so that they start full.
  async function history() {
    try {
      const r = await fetch('history.json', { cache: 'no-store' });
      if (!r.ok) return;
      const h = await r.json();
      for (const s of h) {
        begin(s);
        plot(s);
      }
      if (h.length) redraw();
      document.body.dataset.history = String(h.length);
    } catch (e) {
      // The charts start empty; poll says what is wrong.
    }
  }

  const live = document.getElementById('live');
  let lastOK = 0;
  async function poll() {
    try {
      const r = await fetch('status.json', { cache: 'no-store' });
      if (!r.ok) throw new Error(r.status + ' ' + r.statusText);
      update(await r.json());
      lastOK = Date.now();
      live.className = 'live ok';
      live.textContent = 'live';
    } catch (e) {
      live.className = 'live bad';
      live.textContent = lastOK ? 'no answer since ' + new Date(lastOK).toLocaleTimeString() : 'no answer: ' + e.message;
    }
    setTimeout(poll, POLL_MS);
  }
  history().then(poll);
})();
