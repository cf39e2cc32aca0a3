// A job's place in its workflow (docs/dependencies.md): the jobs it waits for on the left,
// the job in the middle, the jobs that wait for it on the right, as an SVG of nodes
// coloured by state that link to their jobs. Bounded whatever the workflow: a job may wait
// for up to 1,000 jobs and have any number of dependents, so each side fetches and draws at
// most GRAPH_SIDE of them and says how many more there are.

import { api, ApiError, seg, withQuery } from "./api.js";
import { h, s } from "./dom.js";
import { num, shortId, stateClass } from "./format.js";

export const GRAPH_SIDE = 8;

const NODE_W = 236;
const NODE_H = 44;
const ROW = 54; // a node and the gap below it
const GAP_X = 70; // between columns, where the links run
const HEAD = 22; // the column titles
const TYPE_CHARS = 16; // of a job type shown in a node; the whole type is in its tooltip

/** The job's first dependencies (fetched one by one: the job carries only their ids; a
 * dependency removed by retention has state null) and its first dependents. */
export async function loadNeighbours(job) {
  const ids = job.depends_on.slice(0, GRAPH_SIDE);
  const parent = (id) =>
    api(`/v1/jobs/${seg(id)}`).catch((error) => {
      if (error instanceof ApiError && error.status === 404) return { id, state: null, type: "" };
      throw error;
    });
  const [parents, page] = await Promise.all([
    Promise.all(ids.map(parent)),
    api(withQuery(`/v1/jobs/${seg(job.id)}/dependents`, { limit: GRAPH_SIDE })),
  ]);
  return { parents, parentCount: job.depends_on.length, children: page.jobs, moreChildren: page.next !== null };
}

function clip(text, chars) {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

function box(x, y, ...lines) {
  return [
    s("rect", { x, y, width: NODE_W, height: NODE_H, rx: 8 }),
    lines.map(([cls, text], i) => s("text", { x: x + 10, y: y + 18 + i * 16, class: cls }, text)),
  ];
}

/** A job as a node; `side` says what it is to the job of the page. */
function jobNode(job, x, y, side) {
  const lines = [
    ["node-state", job.state || "removed"],
    ["node-id", job.type ? `${shortId(job.id)} · ${clip(job.type, TYPE_CHARS)}` : shortId(job.id)],
  ];
  const tooltip = s("title", null, [job.id, job.type, job.state || "removed by retention"].filter(Boolean).join("\n"));
  const attrs = { class: `graph-node ${stateClass(job.state)}`, "data-job": job.id, "data-side": side, "data-state": job.state || "removed" };
  if (side === "self") return s("g", { ...attrs, "aria-current": "page" }, tooltip, box(x, y, ...lines));
  if (!job.state) return s("g", attrs, tooltip, box(x, y, ...lines)); // no page to link to
  const label = `${side === "dependency" ? "Dependency" : "Dependent"} ${job.id}, ${job.state}`;
  return s("a", { ...attrs, href: `#/jobs/${encodeURIComponent(job.id)}`, "aria-label": label }, tooltip, box(x, y, ...lines));
}

function moreNode(text, x, y) {
  return s("g", { class: "graph-more" }, box(x, y, ["node-more", text]));
}

function link(x1, y1, x2, y2, met) {
  const mid = (x1 + x2) / 2;
  return s("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, class: met ? "graph-edge met" : "graph-edge" });
}

/** One column: its nodes (and a "more" node), centred in `rows` rows; their middles. */
function column(items, more, x, rows, side) {
  const count = items.length + (more ? 1 : 0);
  const top = HEAD + ((rows - count) * ROW) / 2;
  const nodes = items.map((job, i) => jobNode(job, x, top + i * ROW, side));
  if (more) nodes.push(moreNode(more, x, top + items.length * ROW));
  return { nodes, middles: items.map((_, i) => top + i * ROW + NODE_H / 2) };
}

function summary({ parents, parentCount, children, moreChildren }) {
  const waits = parentCount
    ? `Waits for ${num(parentCount)} job${parentCount === 1 ? "" : "s"}${parentCount > parents.length ? ` (the first ${parents.length} shown)` : ""}.`
    : "Waits for no job.";
  const wanted = moreChildren
    ? `More than ${children.length} jobs wait for this one (the first ${children.length} shown).`
    : children.length
      ? `${children.length} job${children.length === 1 ? " waits" : "s wait"} for this one.`
      : "No job waits for this one.";
  return `${waits} ${wanted}`;
}

/** The graph card for `job` and its neighbours, or null when it has none. */
export function dependencyGraph(job, neighbours) {
  const { parents, parentCount, children, moreChildren } = neighbours;
  if (!parentCount && !children.length) return null;
  const moreParents = parentCount > parents.length ? `+ ${num(parentCount - parents.length)} more` : null;
  const moreKids = moreChildren ? "+ more (not shown)" : null;
  const rows = Math.max(1, parents.length + (moreParents ? 1 : 0), children.length + (moreKids ? 1 : 0));
  const [x0, x1, x2] = [0, NODE_W + GAP_X, 2 * (NODE_W + GAP_X)];
  const left = column(parents, moreParents, x0, rows, "dependency");
  const right = column(children, moreKids, x2, rows, "dependent");
  const self = column([job], null, x1, rows, "self");
  const [middle] = self.middles;
  const width = x2 + NODE_W + 2;
  const height = HEAD + rows * ROW;
  const text = summary(neighbours);
  const heads = [
    [x0, parentCount ? `waits for (${num(parentCount)})` : "waits for nothing"],
    [x1, "this job"],
    [x2, children.length ? `wanted by (${moreChildren ? `${children.length}+` : children.length})` : "wanted by nothing"],
  ];
  const svg = s(
    "svg",
    { class: "graph", id: "dependency-graph", viewBox: `-1 0 ${width} ${height}`, role: "group", "aria-label": `Dependencies of job ${job.id}. ${text}` },
    heads.map(([x, title]) => s("text", { x, y: 14, class: "graph-head" }, title)),
    // a link is solid once the dependency it stands for is met (COMPLETED), dashed until then
    left.middles.map((y, i) => link(NODE_W, y, x1, middle, parents[i].state === "COMPLETED")),
    right.middles.map((y) => link(x1 + NODE_W, middle, x2, y, job.state === "COMPLETED")),
    left.nodes,
    self.nodes,
    right.nodes,
  );
  return h(
    "section",
    { class: "card graph-card", "aria-labelledby": "graph-title" },
    h("h2", { id: "graph-title" }, "Dependencies"),
    h("p", { class: "muted", id: "graph-summary" }, text),
    h("div", { class: "graph-wrap" }, svg),
  );
}
