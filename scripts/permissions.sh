#!/bin/sh
# The launcher's permission set, in one place: `deno task compile` bakes it into the binary, `deno task run:prod` and
# `deno task run:bundle` run under it. It is broad because what the controller may reach is known only at start, from
# the deployment's flags and environment; main.ts loads no npm code and runs every command in a Worker narrowed to
# what that command needs (src/cli/permissions.ts, printed at debug level: `--log-level debug`).
#   --allow-net/read/env  the union of what the Worker may be granted: API server, lab hosts, listeners; credentials.
#   --allow-sys           hostname (leader identity), homedir (doctor's ~/.ssh).
#   --allow-run           only for a kubeconfig's exec credential plugin: the Worker gets that one command.
#   --unstable-worker-options  lets a Worker have fewer permissions than its parent.
echo "--no-prompt --unstable-worker-options --allow-net --allow-read --allow-env --allow-sys=hostname,homedir --allow-run"
