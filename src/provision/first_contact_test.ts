import assert from "node:assert/strict";
import { type FirstContacts, withHostFacts } from "./first_contact.ts";

/** A promise settled from outside. */
function deferred<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => [resolve, reject] = [res, rej]);
  return { promise, resolve, reject };
}

/** A host whose facts are learned by the first apply's first round trip; each apply says which facts it rendered for. */
class Host {
  facts: string | undefined;
  readonly contacts: FirstContacts = new Map();
  readonly renderedFor: (string | undefined)[] = [];
  /** The bound the waiters are given: settled by the test, never by a clock. */
  readonly giveUp = deferred();

  deploy(apply: (facts: string | undefined, learned: () => void) => Promise<string>) {
    return withHostFacts(this.contacts, "h:22", () => this.facts, (facts, learned) => {
      this.renderedFor.push(facts);
      return apply(facts, learned);
    }, (first) => Promise.race([first, this.giveUp.promise]));
  }
}

Deno.test("first contact: the first apply goes alone; the others render for the facts it learned", async () => {
  const h = new Host();
  const roundTrip = deferred();
  const first = h.deploy(async (_facts, learned) => {
    await roundTrip.promise;
    h.facts = "podman=5.4.2 kvm=660:993";
    learned();
    return "first";
  });
  const others = [h.deploy(() => Promise.resolve("a")), h.deploy(() => Promise.resolve("b"))];
  await Promise.resolve();
  assert.deepEqual(h.renderedFor, [undefined], "the others wait");
  roundTrip.resolve();
  assert.deepEqual(await Promise.all([first, ...others]), ["first", "a", "b"]);
  assert.deepEqual(h.renderedFor, [undefined, "podman=5.4.2 kvm=660:993", "podman=5.4.2 kvm=660:993"]);
  assert.equal(h.contacts.size, 0, "nothing kept once the host is met");
  await h.deploy(() => Promise.resolve("later"));
  assert.equal(h.renderedFor.at(-1), "podman=5.4.2 kvm=660:993", "known facts: no gate");
});

Deno.test("first contact: the others go on as soon as the facts are learned, not when the first apply ends", async () => {
  const h = new Host();
  const rest = deferred();
  const first = h.deploy(async (_facts, learned) => {
    h.facts = "podman=5.4.2 kvm=none";
    learned();
    await rest.promise; // its second apply, rendered for the facts, still under way
    return "first";
  });
  assert.equal(await h.deploy(() => Promise.resolve("other")), "other");
  assert.deepEqual(h.renderedFor, [undefined, "podman=5.4.2 kvm=none"]);
  rest.resolve();
  assert.equal(await first, "first");
});

Deno.test("first contact: a first apply that fails releases the others, which proceed on their own", async () => {
  const h = new Host();
  const fail = deferred();
  const first = h.deploy(async () => {
    await fail.promise;
    throw new Error("ssh: connect ECONNREFUSED");
  });
  const other = h.deploy(() => Promise.resolve("other"));
  fail.resolve();
  await assert.rejects(first, /ECONNREFUSED/);
  assert.equal(await other, "other");
  assert.deepEqual(h.renderedFor, [undefined, undefined], "no facts learned: rendered for none, as before");
  assert.equal(h.contacts.size, 0, "the next deploy is a first contact again");
});

Deno.test("first contact: the wait is bounded; a first apply that hangs does not hold the others", async () => {
  const h = new Host();
  const hang = deferred<string>();
  const first = h.deploy(() => hang.promise);
  const other = h.deploy(() => Promise.resolve("other"));
  h.giveUp.resolve();
  assert.equal(await other, "other");
  assert.deepEqual(h.renderedFor, [undefined, undefined]);
  hang.resolve("first");
  assert.equal(await first, "first");
});

Deno.test("first contact: hosts are gated apart", async () => {
  const contacts: FirstContacts = new Map();
  const hang = deferred<string>();
  const a = withHostFacts(contacts, "a:22", () => undefined, () => hang.promise);
  assert.equal(await withHostFacts(contacts, "b:22", () => undefined, () => Promise.resolve("b")), "b");
  hang.resolve("a");
  assert.equal(await a, "a");
});
