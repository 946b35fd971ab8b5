import collections
import glob
import json

rows = []
for f in sorted(glob.glob("results_*.jsonl")):
    for line in open(f):
        rows.append(json.loads(line))
# keep the last record per key
keyed = collections.OrderedDict()
for r in rows:
    keyed[(r["model"], r["dtype"], r["measure"], r["rho"], r.get("batch"))] = r
rows = list(keyed.values())


def cls(r):
    reached = r["share"] >= 0.99
    f = r["flagged"]
    if reached and not f:
        return "good (reached, unflagged)"
    if not reached and f:
        return "good (short, flagged)"
    if not reached and not f:
        return f"DEFECT short {100 * r['share']:.1f}% unflagged"
    why = []
    if r["reach"] is not None and r["reach"] < 0.99:
        why.append(f"reach {r['reach']:.3f}")
    if r["local"] is False:
        why.append("not local")
    if r["rounding"] > 0.01 * abs(r["default"]):
        why.append("rounding")
    return "false alarm: " + ", ".join(why)


print(
    "| model | dtype | measure | rho | batch | default | best | share | reach | local "
    "| path_share | flagged | evals (def/ref) | classification |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
counts = collections.Counter()
for r in sorted(
    rows,
    key=lambda r: (
        r["model"],
        r["dtype"],
        ["adaptive", "worst_case", "geodesic_inv", "geodesic_mix"].index(r["measure"]),
        r["rho"],
        r.get("batch", 0),
    ),
):
    if "error" in r:
        print(
            f"| {r['model']} | {r['dtype']} | {r['measure']} | {r['rho']} | - "
            f"| ERROR {r['error'][:80]} |"
        )
        continue
    c = cls(r)
    counts[
        (
            r["measure"],
            c.split(":")[0].split(" short")[0]
            if not c.startswith("DEFECT")
            else "DEFECT short unflagged",
        )
    ] += 1
    ps = r.get("path_share")
    ps = "-" if ps is None else f"{ps:.3f}"
    assert r["flagged"] == r["field_flag"], r
    print(
        f"| {r['model']} | {r['dtype'][5:]} | {r['measure']} | {r['rho']} | {r['batch']} "
        f"| {r['default']:.5g} | {r['best']:.5g} | {100 * r['share']:.1f}% | {r['reach']:.3f} "
        f"| {r['local']} | {ps} | {'yes' if r['flagged'] else 'no'} "
        f"| {r['evals']}/{r['ref_evals']} | {c} |"
    )
print()
for k, v in sorted(counts.items()):
    print(k, v)
print(
    "nonfinite records:",
    [(r["model"], r["measure"], r["rho"]) for r in rows if not r.get("finite", True)],
)
print("other warnings:", {w for r in rows for w in r.get("other_warnings", [])})
