/**
 * A 429 storm from the real API server: API Priority and Fairness sheds one user's requests the way an overloaded
 * server does. Its priority level has no seats of its own, borrows none and rejects instead of queuing, so APF lets
 * one request of the user run at a time (it never starves a level completely) and answers every concurrent one 429
 * with its own Retry-After. The user is impersonated through the admin kubeconfig (`as:`), so the storm hits only the
 * client under test: the test's admin is exempt (system:masters). Needs a control plane with APF on.
 */
import { parse, stringify } from "yaml";
import type { KubeObject } from "../src/api/types.ts";
import { KubeClient, KubeError, type Resource } from "../src/kube/client.ts";
import { waitFor } from "./env.ts";

const FLOWCONTROL = { group: "flowcontrol.apiserver.k8s.io", version: "v1" };
const PRIORITY_LEVELS: Resource = {
  ...FLOWCONTROL,
  plural: "prioritylevelconfigurations",
  kind: "PriorityLevelConfiguration",
};
const FLOW_SCHEMAS: Resource = { ...FLOWCONTROL, plural: "flowschemas", kind: "FlowSchema" };
const CLUSTER_ROLE_BINDINGS: Resource = {
  group: "rbac.authorization.k8s.io",
  version: "v1",
  plural: "clusterrolebindings",
  kind: "ClusterRoleBinding",
};

/** A copy of `kubeconfig` that impersonates `user`, who is given cluster-admin (the storm is about rate, not rights). */
export async function impersonatingKubeconfig(
  admin: KubeClient,
  kubeconfig: string,
  user: string,
  to: string,
): Promise<void> {
  const config = parse(await Deno.readTextFile(kubeconfig)) as {
    "current-context": string;
    contexts: { name: string; context: { user: string } }[];
    users: { name: string; user: Record<string, unknown> }[];
  };
  const ctx = config.contexts.find((c) => c.name === config["current-context"])!;
  config.users.find((u) => u.name === ctx.context.user)!.user.as = user;
  await Deno.writeTextFile(to, stringify(config), { mode: 0o600 });
  await admin.create(CLUSTER_ROLE_BINDINGS, {
    metadata: { name: user },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "cluster-admin" },
    subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name: user }],
  } as KubeObject);
}

export class ApfStorm {
  private constructor(private readonly admin: KubeClient, readonly name: string, readonly user: string) {}

  /** The storm's objects for `user`; call start() to let it rage. */
  static async create(admin: KubeClient, user: string): Promise<ApfStorm> {
    const name = user;
    await admin.create(PRIORITY_LEVELS, {
      metadata: { name },
      spec: {
        type: "Limited",
        limited: {
          nominalConcurrencyShares: 0,
          lendablePercent: 0,
          borrowingLimitPercent: 0,
          limitResponse: { type: "Reject" },
        },
      },
    } as KubeObject);
    return new ApfStorm(admin, name, user);
  }

  /** Starts rejecting; returns once `probe` (a client of the user; fetch does not retry) is answered 429. */
  async start(probe: KubeClient): Promise<void> {
    await this.admin.create(FLOW_SCHEMAS, {
      metadata: { name: this.name },
      spec: {
        priorityLevelConfiguration: { name: this.name },
        matchingPrecedence: 50,
        distinguisherMethod: { type: "ByUser" },
        rules: [{
          subjects: [{ kind: "User", user: { name: this.user } }],
          resourceRules: [{
            verbs: ["*"],
            apiGroups: ["*"],
            resources: ["*"],
            clusterScope: true,
            namespaces: ["*"],
          }],
          nonResourceRules: [{ verbs: ["*"], nonResourceURLs: ["*"] }],
        }],
      },
    } as KubeObject);
    await waitFor(async () => (await this.statuses(probe)).includes(429), { what: "APF to reject the storm's user" });
  }

  /** Ends the storm; returns once the probe gets through again. */
  async stop(probe: KubeClient): Promise<void> {
    await this.admin.delete(FLOW_SCHEMAS, undefined, this.name);
    await waitFor(async () => (await this.statuses(probe)).every((s) => s === 200), {
      what: "APF to admit the storm's user again",
    });
  }

  /** Requests of the storm's priority level the server rejected so far (its own metric). */
  async rejected(): Promise<number> {
    const text = await (await this.admin.fetch("GET", "/metrics")).text();
    let n = 0;
    for (const line of text.split("\n")) {
      if (line.startsWith("apiserver_flowcontrol_rejected_requests_total{") && line.includes(`"${this.name}"`)) {
        n += Number(line.split(" ").pop());
      }
    }
    return n;
  }

  async remove(): Promise<void> {
    await this.admin.delete(FLOW_SCHEMAS, undefined, this.name);
    await this.admin.delete(PRIORITY_LEVELS, undefined, this.name);
    await this.admin.delete(CLUSTER_ROLE_BINDINGS, undefined, this.user);
  }

  /** The answers to concurrent requests: one at a time is always let through. */
  private statuses(probe: KubeClient): Promise<number[]> {
    return Promise.all(Array.from({ length: 16 }, () => this.status(probe)));
  }

  private async status(probe: KubeClient): Promise<number> {
    try {
      const res = await probe.fetch("GET", "/api/v1/namespaces/default");
      await res.body?.cancel();
      return res.status;
    } catch (e) {
      if (e instanceof KubeError) return e.status;
      throw e;
    }
  }
}
