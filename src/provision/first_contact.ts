/**
 * First contact with a lab host whose facts are not known yet (host_facts.ts). Files rendered for other facts than the
 * host's are refused (`facts-changed`), so an instance applied then may take two round trips: at 100 hosts x 8
 * instances that was 1600 applies for 800 instances. The first deploy on such a host goes alone; every other one met
 * meanwhile on that host waits, a bounded time, for the facts that first round trip learns, and renders for them: one
 * apply each.
 */

/** How long the others wait for the first one's facts: an SSH connect and one short refused script, with room. */
export const FIRST_CONTACT_WAIT_MS = 30_000;

/** Per host (factsKey), the first contact under way: settles once it learned the host's facts or ended. */
export type FirstContacts = Map<string, Promise<void>>;

/**
 * Runs `apply` with the facts to render for: `known()` at once when there are some. On a host with none, the first
 * caller runs alone and calls `learned` as soon as it knows them (or its apply ends, either way); the callers met
 * meanwhile wait until then, or until `bound` gives up on it, and run with what is known by then. That may be nothing
 * (the first one failed, or is slow): each then proceeds on its own, so a failed first contact wedges no one.
 */
export async function withHostFacts<F, T>(
  contacts: FirstContacts,
  key: string,
  known: () => F | undefined,
  apply: (facts: F | undefined, learned: () => void) => Promise<T>,
  bound: (first: Promise<void>) => Promise<void> = (first) => waitAtMost(first, FIRST_CONTACT_WAIT_MS),
): Promise<T> {
  if (known() === undefined) {
    const first = contacts.get(key);
    if (first) await bound(first);
    else {
      let release!: () => void;
      const gate = new Promise<void>((resolve) => release = resolve);
      contacts.set(key, gate);
      const learned = () => {
        if (contacts.get(key) === gate) contacts.delete(key);
        release();
      };
      try {
        return await apply(undefined, learned);
      } finally {
        learned();
      }
    }
  }
  return apply(known(), () => {});
}

/** Settles when `p` does or after `ms`, whichever comes first, leaving no timer behind. */
async function waitAtMost(p: Promise<void>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    await Promise.race([p, new Promise<void>((resolve) => timer = setTimeout(resolve, ms))]);
  } finally {
    clearTimeout(timer);
  }
}
