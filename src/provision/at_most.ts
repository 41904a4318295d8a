/**
 * `fn` over `items` with at most `n` calls at once, results in the items' order. For fan-outs to every lab host, where
 * each call holds an SSH channel and its buffers on the controller: the orphan sweep's 500 inspections at once raised
 * the scale bench's RSS by some 130 MiB within seconds (bench/results/scale-findings.md, eighth round). After a call
 * fails no new one starts, and the first failure is what this rejects with.
 */
export async function mapAtMost<T, R>(items: readonly T[], n: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  if (!(n >= 1)) throw new RangeError(`mapAtMost: n must be at least 1, not ${n}`);
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      try {
        out[i] = await fn(items[i]);
      } catch (e) {
        next = items.length;
        throw e;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  return out;
}
