#!/bin/sh
# The launcher's permission set, in one place: `deno task compile` bakes it into the binary, `deno task run:prod` and
# `deno task run:bundle` run under it. It is broad because what the controller may reach is known only at start, from
# the deployment's flags and environment; main.ts loads no npm code but npm:yaml (to read the kubeconfig) and runs
# every command in a Worker narrowed to what that command needs (src/cli/permissions.ts, printed at debug level:
# `--log-level debug`).
#   --allow-net/read/env  the union of what the Worker may be granted: API server, lab hosts, listeners; credentials.
#   --allow-sys           hostname (leader identity), homedir (doctor's ~/.ssh).
#   --allow-run           only for a kubeconfig's exec credential plugin: the Worker gets that one command.
#   --unstable-worker-options  lets a Worker have fewer permissions than its parent.
# And one flag that is not a permission: V8 sizes its heap from the machine's memory, not the pod's limit, so without
# a bound the heap fills with garbage it has not bothered to collect until the kernel kills the pod (512Mi in
# manifests/). 256 MiB holds the live heap of about 15,000 instances (13 KiB each, bench/results/scale-findings.md);
# QSP_MAX_HEAP_MIB at build time changes it, with the Deployment's memory limit about 250 MiB above it. The young
# generation's semi-spaces are bounded to 4 MiB (V8's default lets them grow to 16): at 100 x 8 on the scale bench that
# cut the RSS converged from 220 to 157 MiB (heap 113 -> 58 MiB) for 2.6 s more controller CPU (8.7 -> 11.3 s), see
# bench/results/scale-findings.md.
echo "--no-prompt --unstable-worker-options --allow-net --allow-read --allow-env --allow-sys=hostname,homedir --allow-run" \
  "--v8-flags=--max-old-space-size=${QSP_MAX_HEAP_MIB:-256},--max-semi-space-size=4"
