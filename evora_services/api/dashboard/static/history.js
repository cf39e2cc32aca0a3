// Samples of each queue's stats taken at every refresh while the dashboard is open (the
// api reports rates over fixed windows, not a series), kept in sessionStorage so that
// moving between pages or reloading keeps the line going.

const KEY = "evora.samples";
const KEEP = 240; // at 5 s per refresh: 20 minutes
const MIN_GAP_MS = 1000;

let samples = load();

function load() {
  try {
    const data = JSON.parse(sessionStorage.getItem(KEY) || "{}");
    return data && typeof data === "object" ? data : {};
  } catch {
    return {};
  }
}

function save() {
  try {
    sessionStorage.setItem(KEY, JSON.stringify(samples));
  } catch {
    // storage full: the charts just start over next time
  }
}

/** Record one sample per queue from a list of queue stats. */
export function record(queueStats, now = Date.now()) {
  for (const stats of queueStats) {
    const list = Object.prototype.hasOwnProperty.call(samples, stats.queue) ? samples[stats.queue] : [];
    const last = list[list.length - 1];
    if (last && now - last.t < MIN_GAP_MS) continue;
    list.push({
      t: now,
      done: Number(stats.throughput.completed_per_minute["1m"] || 0),
      wait95: Number(stats.latency_ms.wait.p95 || 0),
      run95: Number(stats.latency_ms.run.p95 || 0),
    });
    samples[stats.queue] = list.slice(-KEEP);
  }
  save();
}

/** [{t, v}] of one field of a queue's samples. */
export function series(queue, field) {
  const list = Object.prototype.hasOwnProperty.call(samples, queue) ? samples[queue] : [];
  return list.map((p) => ({ t: p.t, v: p[field] }));
}

export function forget() {
  samples = {};
  sessionStorage.removeItem(KEY);
}
