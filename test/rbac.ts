/**
 * The controller's RBAC from manifests/ installed in a namespace, and a kubeconfig that authenticates as its
 * ServiceAccount: what the RBAC tests and the sandbox run the controller as, instead of cluster-admin.
 */
import { parse, stringify } from "yaml";
import type { KubeObject } from "../src/api/types.ts";
import { isConflict, type KubeClient, type Resource, resourcePath } from "../src/kube/client.ts";
import { SECRETS } from "../src/kube/resources.ts";

export const MANIFESTS = new URL("../manifests/", import.meta.url);

export interface PolicyRule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
  resourceNames?: string[];
}

export async function manifest<T = KubeObject>(file: string): Promise<T> {
  return parse(await Deno.readTextFile(new URL(file, MANIFESTS))) as T;
}

export const SERVICE_ACCOUNTS: Resource = {
  group: "",
  version: "v1",
  plural: "serviceaccounts",
  kind: "ServiceAccount",
};
export const ROLES: Resource = { group: "rbac.authorization.k8s.io", version: "v1", plural: "roles", kind: "Role" };
export const ROLE_BINDINGS: Resource = {
  group: "rbac.authorization.k8s.io",
  version: "v1",
  plural: "rolebindings",
  kind: "RoleBinding",
};
export const CLUSTER_ROLES: Resource = {
  group: "rbac.authorization.k8s.io",
  version: "v1",
  plural: "clusterroles",
  kind: "ClusterRole",
};
export const CLUSTER_ROLE_BINDINGS: Resource = {
  group: "rbac.authorization.k8s.io",
  version: "v1",
  plural: "clusterrolebindings",
  kind: "ClusterRoleBinding",
};
export const DEPLOYMENTS: Resource = { group: "apps", version: "v1", plural: "deployments", kind: "Deployment" };

/** A manifest retargeted to a namespace (the RoleBinding's subject too). */
export async function inNamespace<T extends KubeObject>(file: string, ns: string): Promise<T> {
  const o = await manifest<T & { subjects?: { namespace?: string }[] }>(file);
  o.metadata.namespace = ns;
  for (const s of o.subjects ?? []) s.namespace = ns;
  return o;
}

/**
 * Installs the manifests' ServiceAccount, Role (or the given rules in its place) and RoleBinding in `ns` (kept if they
 * exist), and returns the path of a kubeconfig, written in `dir`, that authenticates as that ServiceAccount.
 */
export async function installControllerRbac(
  admin: KubeClient,
  adminKubeconfig: string,
  ns: string,
  dir: string,
  rules?: PolicyRule[],
  /** Also apply manifests/known-hosts-secret.yaml, as `kubectl apply -k manifests` does (default: with its Role). */
  pinSecret = !rules,
): Promise<string> {
  const sa = await inNamespace("serviceaccount.yaml", ns);
  const role = await inNamespace<KubeObject & { rules: PolicyRule[] }>("role.yaml", ns);
  if (rules) role.rules = rules;
  const ensure = (r: Resource, o: KubeObject) => admin.create(r, o).catch((e) => isConflict(e) ? o : Promise.reject(e));
  await ensure(SERVICE_ACCOUNTS, sa);
  await ensure(ROLES, role);
  await ensure(ROLE_BINDINGS, await inNamespace("rolebinding.yaml", ns));
  if (pinSecret) await ensure(SECRETS, await inNamespace("known-hosts-secret.yaml", ns));
  return await serviceAccountKubeconfig(adminKubeconfig, admin, ns, sa.metadata.name!, dir);
}

/**
 * manifests/clusterrole.yaml and its binding for the ServiceAccount in `ns` (what reads the cluster id), named for
 * that namespace since they are cluster-scoped and runs side by side must not share them. Returns their removal.
 */
export async function installClusterIdRole(admin: KubeClient, ns: string): Promise<() => Promise<void>> {
  const role = await manifest<KubeObject>("clusterrole.yaml");
  role.metadata.name = `${role.metadata.name}-${ns}`;
  const binding = await inNamespace<KubeObject & { roleRef: { name: string } }>("clusterrolebinding.yaml", ns);
  delete binding.metadata.namespace;
  binding.metadata.name = role.metadata.name;
  binding.roleRef.name = role.metadata.name!;
  await admin.create(CLUSTER_ROLES, role);
  await admin.create(CLUSTER_ROLE_BINDINGS, binding);
  return async () => {
    await admin.delete(CLUSTER_ROLE_BINDINGS, undefined, binding.metadata.name!);
    await admin.delete(CLUSTER_ROLES, undefined, role.metadata.name!);
  };
}

/**
 * A kubeconfig that authenticates as the ServiceAccount itself, with a token from the TokenRequest API: its real
 * identity and groups, as in a Pod. (A client certificate cannot carry it: `system:serviceaccount:<ns>:<name>` is
 * longer than the 64 characters a certificate's CN may have.)
 */
async function serviceAccountKubeconfig(
  adminKubeconfig: string,
  admin: KubeClient,
  ns: string,
  sa: string,
  dir: string,
) {
  const req = await admin.request<{ status: { token: string } }>(
    "POST",
    `${resourcePath(SERVICE_ACCOUNTS, { namespace: ns, name: sa })}/token`,
    { body: { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: { expirationSeconds: 3600 } } },
  );
  const cluster = parse(await Deno.readTextFile(adminKubeconfig)).clusters[0].cluster;
  const path = `${dir}/kubeconfig-${sa}`;
  await Deno.writeTextFile(
    path,
    stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "qsp", cluster }],
      users: [{ name: sa, user: { token: req.status.token } }],
      contexts: [{ name: "qsp", context: { cluster: "qsp", user: sa } }],
      "current-context": "qsp",
    }),
    { mode: 0o600 },
  );
  return path;
}
