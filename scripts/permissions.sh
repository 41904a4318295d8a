#!/bin/sh
# The production permission set, in one place: `deno task compile` bakes it into the binary, `deno task run:prod`
# and test/permissions_test.ts run main.ts under it. Each grant was measured by running with less and widening only
# on a concrete NotCapable error:
#   --allow-env   whole: the `debug` package (under @kubernetes/client-node) enumerates the environment on import.
#   --allow-sys   hostname: the leader election identity. uid: node:fs accessSync, with which client-node probes for
#                 the in-cluster token.
#   --allow-read  the service account volume (checked on the literal path, not on its ..data symlinks), plus
#                 QSP_KUBECONFIG. Nothing else is read at run time.
#   --allow-net   the API server, the health listener and the lab hosts' SSH ports; nothing else.
# Build-time variables (unset or empty = default):
#   QSP_ALLOW_API     API server, CIDR:port or host:port. Default 10.96.0.0/12:443: the kubeadm/kind service range,
#                     where KUBERNETES_SERVICE_HOST lives (OpenShift: 172.30.0.0/16:443).
#   QSP_ALLOW_LAB     lab hosts, comma-separated CIDR:port, host:port or *.domain:port (":22" = any host on port 22).
#                     Matched against what the controller dials: the class's host.name as written (a DNS name must be
#                     listed by name) or its --host-alias address. Default: the RFC 1918 ranges on port 22.
#   QSP_ALLOW_LISTEN  the health probe listener. Default 0.0.0.0:8081 (the operator passes :8081).
#   QSP_KUBECONFIG    a kubeconfig the binary may read, for runs outside a cluster; certificates and keys must be
#                     inline (*-data), or their files added here with commas.
set -eu
api=${QSP_ALLOW_API:-10.96.0.0/12:443}
lab=${QSP_ALLOW_LAB:-10.0.0.0/8:22,172.16.0.0/12:22,192.168.0.0/16:22}
listen=${QSP_ALLOW_LISTEN:-0.0.0.0:8081}
read=/var/run/secrets/kubernetes.io/serviceaccount${QSP_KUBECONFIG:+,$QSP_KUBECONFIG}
echo "--no-prompt --allow-env --allow-sys=hostname,uid --allow-read=$read --allow-net=$api,$listen,$lab"
