/**
 * The fault suite: "nothing is lost". Each scenario injects a fault into a real control plane, real lab hosts and
 * the controller running as a subprocess, then checks the invariants of invariants.ts. A bounded form runs in the
 * normal `deno task test`; `deno task test:faults` runs the full one.
 *
 * QSP_FAULT_TRIALS: controller-kill trials (default 3; the full form sets 25).
 * QSP_FAULT_HOST_TRIALS: repetitions of the host, API, credential, disk and change scenarios (default 1).
 * QSP_FAULT_SILENCE_SECONDS: how long the controller's connections stay silent (default 10).
 * QSP_FAULT_STORM_SECONDS: how long the API server answers the controller 429 (default 10).
 * QSP_FAULT_CLUSTER_TRIALS: changes and faults of cluster A in the two-clusters world (default 1: the orphan; then random).
 * QSP_FAULT_DELETION_TRIALS: deletion orders, each with a random fault (default 2); QSP_FAULT_DELETION_ORDER and
 * QSP_FAULT_DELETION_FAULT (parts of their names) narrow the draw, e.g. to run again the one a failed trial drew.
 * QSP_FAULT_FULL=1: wait for the controller to notice a cut network (about a minute: SSH keepalive) instead of
 * restoring it after 10 s.
 */
import assert from "node:assert/strict";
import { killScenario } from "./kill.ts";
import { hostScenario } from "./host_faults.ts";
import { apiScenario } from "./api_faults.ts";
import { credentialScenario } from "./credentials.ts";
import { diskScenario } from "./disk.ts";
import { changeScenario } from "./changes.ts";
import { twoClustersScenario } from "./two_clusters.ts";
import { deletionScenario } from "./deletion.ts";
import { type Outcome, outcomes, outcomeTable, trialCount } from "./world.ts";

const opts = { sanitizeOps: false, sanitizeResources: false };
const KILL_TRIALS = trialCount("QSP_FAULT_TRIALS", 3);
const REPS = trialCount("QSP_FAULT_HOST_TRIALS", 1);
const SILENCE_S = trialCount("QSP_FAULT_SILENCE_SECONDS", 10);
const STORM_S = trialCount("QSP_FAULT_STORM_SECONDS", 10);
const CLUSTER_TRIALS = trialCount("QSP_FAULT_CLUSTER_TRIALS", 1);
const DELETION_TRIALS = trialCount("QSP_FAULT_DELETION_TRIALS", 2);
const FULL = Deno.env.get("QSP_FAULT_FULL") === "1";
const failures = (rs: Outcome[]) => rs.filter((r) => !r.ok).map((r) => `${r.trial}: ${r.note}`);

Deno.test({
  name: `faults: the controller SIGKILLed mid-work and restarted (${KILL_TRIALS} trials) and the orphan sweep`,
  ...opts,
  async fn() {
    const rs = await killScenario(KILL_TRIALS);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: `faults: lab host faults: sshd stopped, network cut, reboot (${REPS}x)`,
  ...opts,
  async fn() {
    const rs = await hostScenario(REPS, FULL);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: `faults: API server restarted, etcd compacted, connections silent for ${SILENCE_S}s, ` +
    `a ${STORM_S}s 429 storm (${REPS}x)`,
  ...opts,
  async fn() {
    const rs = await apiScenario(REPS, SILENCE_S * 1000, STORM_S * 1000);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: `faults: token rotated; SSH key replaced by a wrong one, then fixed (${REPS}x)`,
  ...opts,
  async fn() {
    const rs = await credentialScenario(REPS);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: `faults: a lab host's config directory full (${REPS}x)`,
  ...opts,
  async fn() {
    const rs = await diskScenario(REPS);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name:
    `faults: the set changes while others stay: scale up/down, image change (concurrent applies), host move, re-create (${REPS}x)`,
  ...opts,
  async fn() {
    const rs = await changeScenario(REPS);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: `faults: two clusters on one lab host, sweeps on: ${CLUSTER_TRIALS} changes and faults of cluster A, ` +
    "0 foreign changes to cluster B's instances",
  ...opts,
  async fn() {
    const rs = await twoClustersScenario(CLUSTER_TRIALS);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: `faults: deletion orders with the real garbage collector and namespace controller, each under a random fault ` +
    `(controller SIGKILL, host unreachable briefly or past the grace, ${STORM_S}s 429 storm; ${DELETION_TRIALS} trials)`,
  ...opts,
  async fn() {
    const rs = await deletionScenario(DELETION_TRIALS, STORM_S * 1000);
    assert.deepEqual(failures(rs), []);
  },
});

Deno.test({
  name: "faults: summary",
  ...opts,
  fn() {
    console.log(`\n${outcomeTable(outcomes)}`);
  },
});
