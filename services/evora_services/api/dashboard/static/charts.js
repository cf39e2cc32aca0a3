// Small inline-SVG charts. Each is an image with a text alternative (the same numbers are
// also shown as text next to it), so nothing depends on seeing the chart.

import { s } from "./dom.js";
import { ms, num, rate, span, stateClass, STATES, STATE_TITLES } from "./format.js";

function svgRoot(width, height, label, cls) {
  return s(
    "svg",
    {
      class: cls,
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": label,
      preserveAspectRatio: "xMinYMin meet",
    },
    s("title", null, label),
  );
}

/**
 * Horizontal bars grouped by row: rows = [{label, values: [v1, v2]}], series = ["wait", "run"].
 * format turns a value into its label text.
 */
export function barChart({ rows, series, label, format }) {
  const rowHeight = series.length * 14 + 10;
  const left = 62;
  const right = 74;
  const width = 380;
  const height = rows.length * rowHeight + 6;
  const max = Math.max(1e-9, ...rows.flatMap((row) => row.values.map((v) => Number(v) || 0)));
  const room = width - left - right;
  const svg = svgRoot(width, height, label, "chart");
  rows.forEach((row, i) => {
    const top = i * rowHeight + 4;
    svg.appendChild(
      s("text", { x: 0, y: top + (rowHeight - 10) / 2 + 4, "dominant-baseline": "middle" }, row.label),
    );
    row.values.forEach((value, j) => {
      const v = Number(value) || 0;
      const barWidth = Math.max(v > 0 ? 2 : 0, (v / max) * room);
      const y = top + j * 14;
      svg.appendChild(s("rect", { x: left, y, width: barWidth, height: 11, rx: 2, class: `bar-${j + 1}` }));
      svg.appendChild(
        s("text", { x: left + barWidth + 5, y: y + 9, class: "value-label" }, format(v)),
      );
    });
  });
  return svg;
}

/** One bar split by state, each part in its state's colour and as wide as its share of
 * the jobs: counts = {STATE: n}. */
export function stateChart(counts) {
  const width = 380;
  const height = 18;
  const total = STATES.reduce((n, state) => n + (counts[state] || 0), 0);
  const label = `Jobs by state: ${STATES.map((state) => `${num(counts[state] || 0)} ${STATE_TITLES[state].toLowerCase()}`).join(", ")}`;
  const svg = svgRoot(width, height, label, "chart state-chart");
  let x = 0;
  for (const state of STATES) {
    const part = total ? ((counts[state] || 0) / total) * width : 0;
    if (part > 0) svg.appendChild(s("rect", { x, y: 0, width: part, height, class: `state-part ${stateClass(state)}`, "data-state": state }));
    x += part;
  }
  return svg;
}

export function throughputChart(rates) {
  const windows = ["1m", "5m", "15m"];
  const rows = windows.map((w) => ({ label: `last ${w}`, values: [rates[w] || 0] }));
  const label =
    "Completed jobs per minute: " +
    windows.map((w) => `over the last ${w}, ${rate(rates[w])}`).join("; ");
  return barChart({ rows, series: ["completed"], label, format: (v) => `${rate(v)}/min` });
}

export function latencyChart(latency) {
  const rows = ["p50", "p95", "p99"].map((p) => ({
    label: p,
    values: [latency.wait[p] || 0, latency.run[p] || 0],
  }));
  const label =
    "Latency percentiles. Wait: " +
    ["p50", "p95", "p99"].map((p) => `${p} ${ms(latency.wait[p])}`).join(", ") +
    ". Run: " +
    ["p50", "p95", "p99"].map((p) => `${p} ${ms(latency.run[p])}`).join(", ");
  return barChart({ rows, series: ["wait", "run"], label, format: ms });
}

/** [{t, v}] of one series of a queue history (docs/http-api.md#queue-history): t in ms,
 * v null where the minute has no measurement. */
export function historyPoints(history, field) {
  const t0 = Date.parse(history.start);
  const step = history.step_seconds * 1000;
  return history[field].map((v, i) => ({ t: t0 + i * step, v }));
}

/**
 * Lines over time: lines = [{name, points: [{t, v}]}], drawn in the order given (the first
 * in colour 1, with an area under it). A null value breaks the line there.
 */
export function lineChart(lines, { label, format, width = 380, height = 120 }) {
  const svg = svgRoot(width, height, label, "chart");
  const top = 10;
  const bottom = height - 18;
  const left = 4;
  const right = width - 60;
  const all = lines.flatMap((line) => line.points);
  const max = Math.max(1e-9, ...all.map((p) => Number(p.v) || 0));
  for (const frac of [0, 0.5, 1]) {
    const y = bottom - frac * (bottom - top);
    svg.appendChild(s("line", { x1: left, x2: right, y1: y, y2: y, class: "grid-line" }));
    svg.appendChild(s("text", { x: right + 6, y: y + 4 }, format(max * frac)));
  }
  if (!all.length) return svg;
  const t0 = Math.min(...all.map((p) => p.t));
  const t1 = Math.max(...all.map((p) => p.t));
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (right - left);
  const y = (v) => bottom - (v / max) * (bottom - top);
  lines.forEach((line, index) => {
    // runs of consecutive measured points, each its own polyline
    const runs = [[]];
    for (const p of line.points) {
      if (p.v === null || p.v === undefined) {
        if (runs[runs.length - 1].length) runs.push([]);
      } else {
        runs[runs.length - 1].push(`${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
      }
    }
    for (const run of runs.filter((r) => r.length)) {
      if (run.length === 1) {
        // a lone measured minute: a dot, as a line needs two points
        const [cx, cy] = run[0].split(",");
        svg.appendChild(s("circle", { cx, cy, r: 2.5, class: `dot line-${index + 1}`, "data-series": line.name }));
        continue;
      }
      const points = run;
      if (index === 0) {
        const first = points[0].split(",")[0];
        const last = points[points.length - 1].split(",")[0];
        svg.appendChild(s("polygon", { points: `${first},${bottom} ${points.join(" ")} ${last},${bottom}`, class: "area" }));
      }
      svg.appendChild(s("polyline", { points: points.join(" "), class: `line line-${index + 1}`, "data-series": line.name }));
    }
  });
  svg.appendChild(s("text", { x: left, y: height - 3 }, `${span((t1 - t0) / 1000)} ago`));
  svg.appendChild(s("text", { x: right, y: height - 3, "text-anchor": "end" }, "now"));
  return svg;
}

/** A tiny line for a table cell. */
export function sparkline(values, label) {
  const width = 100;
  const height = 24;
  const svg = svgRoot(width, height, label, "sparkline");
  if (values.length < 2) return svg;
  const max = Math.max(1, ...values);
  const points = values
    .map((v, i) => `${((i / (values.length - 1)) * (width - 2) + 1).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`)
    .join(" ");
  svg.appendChild(s("polyline", { points, class: "line" }));
  return svg;
}
