
import json, math, sys, yaml
def same(a, b):
    if isinstance(b, dict) and list(b) == ["$num"]:
        return isinstance(a, float) and (math.isnan(a) if b["$num"] == "nan" else a == float(b["$num"]))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
for line in sys.stdin:
    req = json.loads(line)
    try:
        got = yaml.safe_load(req["yaml"])
        out = {"ok": same(got, req["expected"]), "got": repr(got)[:300]}
    except Exception as e:
        out = {"ok": False, "error": type(e).__name__ + ": " + str(e).splitlines()[0]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
