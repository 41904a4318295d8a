import assert from "node:assert/strict";
import { MIN_PODMAN, networkFormText, NEWEST_DIALECT, OLDEST_DIALECT, quadletDialect } from "./quadlet_dialect.ts";

Deno.test("quadletDialect: each key and form from the release whose quadlet has it", () => {
  assert.deepEqual(MIN_PODMAN, [4, 4]);
  const cases: [string, ReturnType<typeof quadletDialect>][] = [
    ["3.4.4", "too-old"],
    ["4.3.1+ds1-8+deb12u1+b3", "too-old"], // Debian 12
    ["4.4.0-rc1", OLDEST_DIALECT],
    ["4.4.1", OLDEST_DIALECT], // RHEL 9.2
    ["4.5.1", OLDEST_DIALECT],
    ["4.6.1", { network: "container", pullKey: true, optionalDevice: true }], // RHEL 9.3
    ["4.9.3", { network: "container", pullKey: true, optionalDevice: true }], // Ubuntu 24.04
    ["5.0.3", { network: "container", pullKey: true, optionalDevice: true }],
    ["5.2.5", { network: "container", pullKey: true, optionalDevice: true }], // RHEL 9.5
    ["5.3.0-rc1", { network: "container", pullKey: true, optionalDevice: true }],
    ["5.3.2", { network: "container", pullKey: true, optionalDevice: true }], // its generator misses the runtime
    ["5.4.0-rc1", NEWEST_DIALECT],
    ["5.4.2", NEWEST_DIALECT], // Debian 13
    ["6.0.0", NEWEST_DIALECT],
    ["10.1.0", NEWEST_DIALECT],
    ["dev", NEWEST_DIALECT],
    ["5", NEWEST_DIALECT],
  ];
  for (const [version, want] of cases) assert.deepEqual(quadletDialect(version), want, version);
});

Deno.test("networkFormText: names the key a person finds in the exporter's quadlet", () => {
  assert.equal(networkFormText(NEWEST_DIALECT), "Network=<name>-runtime.container");
  assert.match(networkFormText(OLDEST_DIALECT), /^Network=container:<name>-runtime with Requires\/After\/BindsTo/);
});
