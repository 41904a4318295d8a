/** Small numeric helpers for the benchmark: percentiles, least-squares lines, rounding. Pure. */

/** The p-th percentile (0..100) by linear interpolation between closest ranks; NaN for no values. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const v = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (v.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

export interface LinearFit {
  intercept: number;
  slope: number;
  /** Coefficient of determination; 1 when the points lie on the line (or all ys are equal). */
  r2: number;
}

/** Ordinary least squares y = intercept + slope * x. Needs two distinct xs. */
export function linearFit(xs: number[], ys: number[]): LinearFit {
  const n = xs.length;
  if (n !== ys.length || n < 2) throw new Error(`linearFit needs two or more points, got ${n}`);
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  let sxx = 0;
  let sxy = 0;
  let syy = 0;
  for (let i = 0; i < n; i++) {
    sxx += (xs[i] - mx) ** 2;
    sxy += (xs[i] - mx) * (ys[i] - my);
    syy += (ys[i] - my) ** 2;
  }
  if (sxx === 0) throw new Error("linearFit needs at least two distinct x values");
  const slope = sxy / sxx;
  return { intercept: my - slope * mx, slope, r2: syy === 0 ? 1 : (sxy * sxy) / (sxx * syy) };
}

/** Rounds to `digits` decimals, keeping NaN and infinities as null so JSON stays valid. */
export function round(v: number, digits = 2): number | null {
  if (!Number.isFinite(v)) return null;
  const f = 10 ** digits;
  return Math.round(v * f) / f;
}

export const seconds = (ms: number) => ms / 1000;
