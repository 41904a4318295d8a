/** Reading Prometheus text exposition (the controller's and the API server's /metrics). Pure. */

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const LINE_RE = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL_RE = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parseProm(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = LINE_RE.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? "").matchAll(LABEL_RE)) {
      labels[k] = v.replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
    }
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

type LabelFilter = (labels: Record<string, string>) => boolean;

/** Sum of every series of `name` that passes `filter`. */
export function total(samples: Sample[], name: string, filter: LabelFilter = () => true): number {
  let sum = 0;
  for (const s of samples) if (s.name === name && filter(s.labels)) sum += s.value;
  return sum;
}

/** A histogram summed over all its label sets: cumulative counts by upper bound, ascending, +Inf last. */
export interface Histogram {
  buckets: [number, number][];
  count: number;
  sum: number;
}

export function histogram(samples: Sample[], name: string): Histogram {
  const byLe = new Map<number, number>();
  for (const s of samples) {
    if (s.name !== `${name}_bucket`) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    byLe.set(le, (byLe.get(le) ?? 0) + s.value);
  }
  return {
    buckets: [...byLe].sort(([a], [b]) => a - b),
    count: total(samples, `${name}_count`),
    sum: total(samples, `${name}_sum`),
  };
}

/** after - before, bucket by bucket: what was observed between two scrapes. */
export function histogramDelta(after: Histogram, before: Histogram): Histogram {
  const prior = new Map(before.buckets);
  return {
    buckets: after.buckets.map(([le, c]) => [le, c - (prior.get(le) ?? 0)]),
    count: after.count - before.count,
    sum: after.sum - before.sum,
  };
}

/** As PromQL's histogram_quantile: linear interpolation inside the bucket holding the q-th observation. */
export function histogramQuantile(q: number, h: Histogram): number {
  if (h.count <= 0 || h.buckets.length === 0) return NaN;
  const rank = q * h.count;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, c] of h.buckets) {
    if (c >= rank) {
      if (le === Infinity) return prevLe; // the highest finite bound is all that is known
      return prevLe + (le - prevLe) * ((rank - prevCount) / Math.max(c - prevCount, 1e-9));
    }
    prevLe = le;
    prevCount = c;
  }
  return prevLe;
}
