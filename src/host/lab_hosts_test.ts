import assert from "node:assert/strict";
import { DEFAULT_LAB_HOSTS, labHostGrants, parseHostAliases, parseLabHosts } from "./lab_hosts.ts";

Deno.test("lab hosts: names, addresses and CIDRs, each with an optional port", () => {
  assert.deepEqual(parseLabHosts("lab-host-01.example.com, 10.0.0.5:2222,192.168.10.0/24:22,[fd00::5]:22,[fd00::6]"), [
    { host: "lab-host-01.example.com", port: undefined },
    { host: "10.0.0.5", port: 2222 },
    { host: "192.168.10.0/24", port: 22 },
    { host: "fd00::5", port: 22 },
    { host: "fd00::6", port: undefined },
  ]);
  assert.equal(parseLabHosts(DEFAULT_LAB_HOSTS).length, 3);
});

Deno.test("lab hosts: a bad entry is named, with what Deno cannot grant", () => {
  assert.throws(() => parseLabHosts(""), /the list is empty/);
  assert.throws(() => parseLabHosts("a:b"), /"a:b" is not HOST, ADDRESS, CIDR or \[IPV6\]/);
  assert.throws(() => parseLabHosts("10.0.0.0/8:70000"), /port out of range/);
  assert.throws(() => parseLabHosts("10.0.0.0/40"), /prefix longer than 32/);
  assert.throws(() => parseLabHosts("fd00::/8"), /IPv6 ranges cannot be granted: list the addresses/);
});

Deno.test("lab hosts: a named host with an alias is granted at its alias address too, on the same port", () => {
  const aliases = parseHostAliases(["lab-host-01.example.com=10.76.0.2", "other=10.1.1.1"]);
  assert.deepEqual(labHostGrants(parseLabHosts("lab-host-01.example.com:22,10.0.0.0/8,[fd00::1]:22"), aliases), [
    "lab-host-01.example.com:22",
    "10.76.0.2:22",
    "10.0.0.0/8",
    "[fd00::1]:22",
  ]);
  assert.throws(() => parseHostAliases(["nope"]), /--host-alias must be NAME=ADDRESS, got "nope"/);
});
