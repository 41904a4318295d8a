/** Trust on first use: the SSH pool reports a host key it accepted, and it is pinned in the namespace's Secret. */
import { Buffer } from "node:buffer";
import type { Secret } from "../api/types.ts";
import { isConflict, type KubeApi } from "../kube/client.ts";
import { SECRETS } from "../kube/resources.ts";
import { decodeSecretValue, type LabTarget, PINNED_HOST_KEYS_KEY, PINNED_HOST_KEYS_SECRET } from "./credentials.ts";

/** Records a host key seen for the first time in the namespace's pin Secret. */
export async function pinHostKey(client: KubeApi, target: LabTarget, line: string): Promise<void> {
  for (let attempt = 0; attempt < 5; attempt++) {
    const current = await client.find<Secret>(SECRETS, target.namespace, PINNED_HOST_KEYS_SECRET);
    const text = decodeSecretValue(current, PINNED_HOST_KEYS_KEY) ?? "";
    if (text.split("\n").includes(line)) return;
    const data = {
      [PINNED_HOST_KEYS_KEY]: Buffer.from(`${text}${text && !text.endsWith("\n") ? "\n" : ""}${line}\n`).toString(
        "base64",
      ),
    };
    try {
      if (!current) {
        await client.create<Secret>(SECRETS, {
          metadata: { name: PINNED_HOST_KEYS_SECRET, namespace: target.namespace },
          type: "Opaque",
          data,
        });
      } else {
        await client.mergePatch(SECRETS, target.namespace, PINNED_HOST_KEYS_SECRET, {
          metadata: { resourceVersion: current.metadata.resourceVersion },
          data,
        });
      }
      return;
    } catch (e) {
      if (!isConflict(e)) throw e; // someone else pinned at the same time: read again
    }
  }
  throw new Error(
    `could not pin the host key of ${target.host} in Secret ${target.namespace}/${PINNED_HOST_KEYS_SECRET}`,
  );
}
